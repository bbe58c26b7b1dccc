// How a step's tokens spread over the experts: what MoE users watch to
// catch a collapsing router (one expert taking most tokens) or a capacity
// that drops too much. Counted on the steps that log, from each MoE layer's
// routing (assignments per expert) and dispatch plan (rows kept per
// expert, after the capacity).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/activations.h"
#include "model/dims.h"

namespace trainer {

struct ExpertLoad {
  int64_t experts = 0;
  // [global layer][expert], flattened layer * experts + e; zero for layers
  // without experts or on other pipeline stages.
  std::vector<double> routed, kept;
  void reset(int64_t layers, int64_t num_experts);
};

// Every rank's counts summed over `host` (collective). tp ranks route alike,
// so the sum over all ranks counts each token tp times: divided out.
void sum_expert_load(ExpertLoad& load, Communicator& host, int tp);

// Adds one micro-batch of local layer `layer` (reads its routing to the host).
void count_expert_load(const ModelDims& d, int64_t layer, const LayerActs& a, ExpertLoad& load);

struct LayerLoad {
  int64_t layer = 0;
  std::vector<double> tokens;  // assignments routed to each expert
  double dropped = 0;          // share of the assignments the capacity dropped
  double max_over_mean = 0;    // the busiest expert's tokens over the mean
};
// The MoE layers that saw tokens, in layer order.
std::vector<LayerLoad> layer_loads(const ExpertLoad& load);

// "moe load: layer 1 max/mean 1.42 dropped 3.1% | layer 3 ..." and the
// metrics.jsonl record {"step": N, "moe": [{"layer": 1, "tokens": [...], ...}]}.
std::string format_expert_load(const std::vector<LayerLoad>& loads);
std::string expert_load_json(int64_t step, const std::vector<LayerLoad>& loads);

}  // namespace trainer
