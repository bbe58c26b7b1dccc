// What the context-parallel ring of one attention layer moves, beside the
// ring itself (model/context_parallel.h), so the start-up line
// (observe/context_report.h) and the communication plan
// (planner/comm_plan.h) count the same bytes.
#pragma once

#include "model/dims.h"

namespace trainer {

// Bytes leaving each rank per attention layer and micro-batch: the forward
// passes every key/value block on cp - 1 times; the backward passes the
// blocks on cp - 1 times and their gradients cp times (back to the owner).
struct RingTraffic {
  double forward_bytes = 0, backward_bytes = 0;
};
RingTraffic ring_traffic(const ModelDims& local);

}  // namespace trainer
