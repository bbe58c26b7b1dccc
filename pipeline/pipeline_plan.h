// The pipeline of a run, from its configuration: layers per stage (explicit
// parallel.pp_layers, or balanced by the cost model) and the simulator's
// action costs per stage.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "model/dims.h"
#include "pipeline/simulate.h"

namespace trainer {

// parallel.pp_layers when given, else balanced_stage_layers.
std::vector<int64_t> stage_layers_for(const Config& c, const ModelDims& global, int stages);

// Per stage: forward = its share of the slowest stage's FLOPs (the slowest
// is 1), backward twice that.
std::vector<ActionCosts> stage_action_costs(const ModelDims& global, const std::vector<int64_t>& layers);

// Micro-batches per step and rank: global batch / (micro-batch x dp x cp).
int64_t microbatches_per_step(const Config& c, int dp);

}  // namespace trainer
