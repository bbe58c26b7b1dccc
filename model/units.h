// Units: the groups of parameters that ZeRO moves together. The embedding
// (token and position tables), each layer, and the head (final norm and the
// untied lm_head) are one unit each, in parameter_list order, so a unit is a
// contiguous byte range of the parameter and gradient arenas. Gradients are
// reduced unit by unit as backward finishes them (the buckets), and under
// ZeRO-3 weights are gathered unit by unit before use.
//
// Each unit's range is padded to a multiple of `shards` x kArenaAlign bytes,
// so that it splits into `shards` equal slices that all start aligned; shard
// r of every unit belongs to data-parallel rank r.
#pragma once

#include <cstddef>
#include <vector>

#include "model/dims.h"
#include "model/params.h"

namespace trainer {

struct UnitLayout {
  int first = 0, end = 0;            // parameter indices [first, end)
  size_t offset = 0;                 // bytes from the start of the full arena
  size_t bytes = 0;                  // padded size, a multiple of shards * kArenaAlign
  std::vector<size_t> param_offset;  // per parameter of the unit, bytes from the unit start
  size_t shard_bytes(int shards) const { return bytes / size_t(shards); }
};

// Unit index of the embedding is 0, of layer i is i + 1, of the head L + 1.
inline int embedding_unit() { return 0; }
inline int layer_unit(int64_t i) { return int(i) + 1; }
inline int head_unit(const ModelDims& d) { return int(d.L) + 1; }

std::vector<UnitLayout> unit_layout(const ModelDims& d, const std::vector<ParamInfo>& params, int shards);
// Sum of the padded unit sizes: the size of a full parameter or gradient arena.
size_t units_total_bytes(const std::vector<UnitLayout>& units);
size_t units_max_bytes(const std::vector<UnitLayout>& units);

}  // namespace trainer
