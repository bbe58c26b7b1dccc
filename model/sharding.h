// The sharding plan (docs/ARCHITECTURE.md "The sharding plan"): computed once from the
// model's global dims, the mesh, this rank's coordinates and the ZeRO stage,
// it says for every parameter this rank holds its global shape, the box of it
// this rank holds along tp (column / row / vocab rows) and ep (experts), the
// pipeline stage(s) that hold it, its ZeRO unit, and the process group its
// gradient is summed over. Model storage, the ZeRO optimizer, checkpoints and
// the memory plan read it; nothing else derives a layout.
//
// Gradient groups: every data-parallel replica of a parameter sums its
// gradient. Dense parameters are replicated over dp x cp (context-parallel
// ranks see different tokens of the same sequences), expert parameters over
// the expert-data-parallel group (the dp x cp ranks at the same position of
// every expert-parallel block). Two more sums on top: with sequence
// parallelism the parameters whole on every tp rank that see sequence-split
// activations (norms, the row-parallel biases, the router) are summed over
// tp; with pipeline stages a tied embedding lives on the first and the last
// stage, whose two copies are summed over that pair.
//
// Sequence parallelism changes only the norms: they run on this rank's token
// rows, so their weight gradients are partial sums over tp. Row-parallel
// biases, the router and the position table see full-sequence (gathered)
// gradients and need no tp sum.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "model/dims.h"
#include "model/params.h"
#include "model/units.h"

namespace trainer {

struct ParamPlacement {
  GradGroup group = GradGroup::DpCp;
  bool tp_sum = false;     // also summed over tp (sequence parallelism: the norms)
  bool tie_sum = false;    // also summed with the other pipeline end (tied embedding)
  // > 1: a key/value projection replicated on this many consecutive tp ranks
  // (fewer kv heads than tp ranks); each holds a partial gradient (its query
  // heads' part), summed over those ranks.
  int kv_replicas = 1;
  // This copy is the one of its identical replicas that goes into
  // checkpoints and counts in the gradient norm (the first stage's copy of a
  // tied table, tp rank 0's copy of a tensor tp does not cut, the first
  // rank's of a replicated kv head).
  bool saved = true;
  std::vector<int> stages; // pipeline stages holding a copy
  int unit = 0;            // ZeRO unit (model/units.h)
};

struct ShardingPlan {
  MeshShape mesh;
  Coords at;
  int ep_rank = 0, edp_rank = 0;
  int zero_stage = 0;
  bool sp = false;
  ModelDims global, local;                    // local: what this rank computes with
  std::vector<int64_t> stage_layers;          // layers per pipeline stage
  std::vector<ParamInfo> params;              // this rank's slices, in unit order
  std::vector<ParamPlacement> placement;      // parallel to params
  std::vector<UnitLayout> units;              // padded for their group's shard count
  // The group a unit's gradients are summed over, its size and this rank's
  // position in it (the ZeRO shard it owns).
  int group_size(GradGroup g) const;
  int group_rank(GradGroup g) const;
  int unit_shards(int unit) const { return group_size(units[size_t(unit)].group); }
  int unit_shard(int unit) const { return group_rank(units[size_t(unit)].group); }
};

// Layers per stage when not given: as even as possible, earlier stages take
// the remainder. Throws ConfigError when there are fewer layers than stages.
std::vector<int64_t> even_stage_layers(int64_t layers, int stages);

// Throws ConfigError naming the key when the model does not divide over the
// mesh (heads, kv heads, FFN width and vocabulary by tp; experts by ep; layers
// over pp). stage_layers empty: even_stage_layers.
ShardingPlan make_sharding_plan(const ModelDims& global, double init_std, const MeshShape& mesh, const Coords& at,
                                int zero_stage, bool sp = false, std::vector<int64_t> stage_layers = {});

// One process, no parallelism: the plan of today's single replica.
ShardingPlan single_plan(const ModelDims& d, double init_std, int zero_stage = 0, int dp = 1, int dp_rank = 0);

}  // namespace trainer
