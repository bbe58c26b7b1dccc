// Units: the groups of parameters that ZeRO moves together, contiguous in
// parameter order: the embedding (token and position tables), each layer's
// dense parameters, each MoE layer's experts, and the head (final norm and
// the untied lm_head, or the last pipeline stage's copy of a tied table).
// A unit is a contiguous byte range of the parameter and gradient arenas.
// Gradients are reduced unit by unit as backward finishes them (the
// buckets), and under ZeRO-3 weights are gathered unit by unit before use.
//
// Experts are a unit of their own because their gradients are summed over
// another group than the dense ones (model/sharding.h). Each unit's range is
// padded to a multiple of its group's size x kArenaAlign bytes, so that it
// splits into equal shards that all start aligned; shard r of a unit belongs
// to rank r of its group.
#pragma once

#include <cstddef>
#include <vector>

#include "model/dims.h"
#include "model/params.h"

namespace trainer {

// Ranks that sum a parameter's gradient (and share its ZeRO shards): dense
// parameters over dp x cp, experts over the expert-data-parallel group.
enum class GradGroup { DpCp, Edp };
const char* grad_group_name(GradGroup g);  // "dp_cp" | "edp"

enum class UnitKind { Embedding, Layer, Experts, Head };

struct UnitLayout {
  UnitKind kind = UnitKind::Layer;
  int64_t layer = -1;                // local layer index (Layer, Experts)
  GradGroup group = GradGroup::DpCp;
  int shards = 1;                    // the group's size
  int first = 0, end = 0;            // parameter indices [first, end)
  size_t offset = 0;                 // bytes from the start of the full arena
  size_t bytes = 0;                  // padded size, a multiple of shards * kArenaAlign
  std::vector<size_t> param_offset;  // per parameter of the unit, bytes from the unit start
  size_t shard_bytes() const { return bytes / size_t(shards); }
};

// The units of `params` (parameter_list order); dense units are padded for
// dense_shards, expert units for expert_shards.
std::vector<UnitLayout> unit_layout(const ModelDims& d, const std::vector<ParamInfo>& params, int dense_shards,
                                    int expert_shards);
// Sum of the padded unit sizes: the size of a full parameter or gradient arena.
size_t units_total_bytes(const std::vector<UnitLayout>& units);

// Which units the model code announces where (UnitHooks): -1 when absent
// (a pipeline stage without the embedding or the head).
struct UnitIndex {
  int embedding = -1, head = -1;
  std::vector<std::vector<int>> layers;  // per local layer: its dense unit, then its experts' unit
};
UnitIndex unit_index(const ModelDims& d, const std::vector<UnitLayout>& units);

}  // namespace trainer
