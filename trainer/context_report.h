// The start-up line of a context-parallel run: the tokens each rank holds,
// its activation bytes, and the ring's traffic per attention layer.
#pragma once

#include <string>

#include "model/sharding.h"

namespace trainer {

// Bytes leaving each rank per attention layer and micro-batch: the forward
// passes every key/value block on cp - 1 times; the backward passes the
// blocks on cp - 1 times and their gradients cp times (back to the owner).
struct RingTraffic {
  double forward_bytes = 0, backward_bytes = 0;
};
RingTraffic ring_traffic(const ModelDims& local);

std::string format_context_plan(const ShardingPlan& plan, int64_t microbatches);

}  // namespace trainer
