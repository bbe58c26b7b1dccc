// The start-up lines of an expert-parallel run: how the experts split, their
// bytes per rank, and the all-to-all traffic of one MoE layer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/sharding.h"

namespace trainer {

struct ExpertLayout {
  int ep = 1, edp = 1;
  int64_t experts = 0, experts_here = 0, moe_layers = 0;  // moe_layers: this rank's (all chunks)
  size_t expert_bytes = 0, dense_bytes = 0;               // this rank's weights
  // One MoE layer, one micro-batch, bytes leaving this rank with uniform
  // routing ((ep - 1) / ep of the N K dispatched rows): the dispatch and the
  // combine in the forward, the same two in the backward.
  double all_to_all_bytes = 0;
};
ExpertLayout expert_layout(const std::vector<ShardingPlan>& chunks);
std::string format_expert_layout(const ExpertLayout& p, int64_t microbatches);

// The start-up line of every MoE run: what the capacity and the
// load-balancing statistics are counted over (a micro-batch's whole
// sequences on every layout: model/moe_routing_plan.h). d: this rank's dims.
std::string format_moe_routing(const ModelDims& d, double capacity_factor, int dp);

}  // namespace trainer
