// The pipeline of a run, from its configuration: layers per stage (explicit
// parallel.pp_layers, or balanced by the cost model) and the simulator's
// action costs per stage.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "comm/mesh.h"
#include "model/dims.h"
#include "model/sharding.h"
#include "pipeline/simulate.h"

namespace trainer {

// parallel.pp_layers when given, else balanced_stage_layers.
std::vector<int64_t> stage_layers_for(const Config& c, const ModelDims& global, int stages);

// Per pipeline rank: forward of one chunk = the mean FLOPs of the rank's
// (virtual) stages relative to the slowest stage (which is 1), backward
// twice that. layers: per virtual stage (ranks x chunks entries).
std::vector<ActionCosts> stage_action_costs(const ModelDims& global, const std::vector<int64_t>& layers, int ranks);

// Micro-batches per step and rank: global batch / (micro-batch x dp); the
// context-parallel ranks of a replica share its sequences.
int64_t microbatches_per_step(const Config& c, int dp);

// Model chunks per pipeline rank (parallel.pp_virtual; 1 unless interleaved)
// and virtual stages (pp x chunks).
int pipeline_chunks(const Config& c);

// The plans of this rank's chunks: chunk k is virtual stage k * pp + at.pp
// of a pipeline of pp x chunks stages whose layers `layers` lists.
std::vector<ShardingPlan> chunk_plans(const ModelDims& global, double init_std, const MeshShape& mesh, const Coords& at,
                                      int zero_stage, bool sp, const std::vector<int64_t>& layers, int chunks);

// This run's schedule (parallel.pp_schedule over pp stages, m micro-batches).
Schedule schedule_for(const Config& c, int stages, int64_t microbatches);

// How a run's pipeline transfers on device d: on the CPU (Gloo) with
// parallel.overlap, sends are posted and receives go one batch ahead;
// NCCL's grouped sends and receives hold the compute stream until both
// ends met (a receive cannot be posted on its own without blocking it),
// and parallel.overlap false waits for every message at its batch.
TransferMode transfer_mode_for(const Config& c, Device d);
// What the planner assumes: train.device cpu is the CPU, anything else a GPU.
TransferMode planned_transfer_mode(const Config& c);

}  // namespace trainer
