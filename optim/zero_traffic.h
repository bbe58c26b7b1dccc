// What ZeRO (optim/zero.h) moves per training step, derived from the unit
// layout exactly as ZeroOptimizer issues it, for the plan
// (planner/comm_plan.h) and the test that holds a real run to it:
//
//   stage 0  all-reduce of every unit, once per step (last micro-batch)
//   stage 1  reduce-scatter of every unit once per step, all-gather of the
//            updated weights after the optimizer step
//   stage 2  reduce-scatter of every unit on every micro-batch (also in a
//            group of one), all-gather after the step
//   stage 3  as 2 without the step's all-gather; the weights are gathered
//            unit by unit before forward and backward use them, except
//            where the unit is still resident in the pool of gathered
//            weights (the replay below: the head and the last layers at the
//            turn from forward to backward, the first ones into the next
//            micro-batch's forward)
//
// Units of zero bytes and (stages 0-1) units with one shard issue nothing.
// Payload as model/tp_traffic.h: an all-reduce's tensor, an all-gather's
// output, a reduce-scatter's input.
#pragma once

#include <cstdint>

#include "model/sharding.h"

namespace trainer {

struct ZeroGroupTraffic {
  int size = 1;  // ranks of the group
  int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0;  // payload bytes per step
  int64_t all_gather_forward = 0, all_gather_backward = 0;     // stage 3: the part of all_gather before use
  int64_t all_reduce_calls = 0, reduce_scatter_calls = 0, all_gather_calls = 0;  // per step (the latency term)
  int64_t total() const { return all_reduce + reduce_scatter + all_gather; }
  // Ring bytes each rank sends: 2 (p-1)/p x all-reduce, (p-1)/p x the others.
  double wire_bytes() const;
};

struct ZeroTraffic {
  ZeroGroupTraffic dense;   // dp x cp (dense units)
  ZeroGroupTraffic expert;  // expert data parallel (expert units)
};

// One step of `micro_batches` micro-batches of a plan (one model chunk;
// ZeRO-2/3 never run with pipeline stages, so their hook order is forward of
// every unit, then backward of every unit in reverse, per micro-batch).
ZeroTraffic zero_traffic(const ShardingPlan& plan, int stage, int64_t micro_batches);

}  // namespace trainer
