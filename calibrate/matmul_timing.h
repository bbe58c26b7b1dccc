// Times the model's linears (calibrate/model_linears.h) through the
// kernels' ops on the run's device and storage type: per shape the forward
// (linear_forward) and both backward products (linear_backward for the
// input gradient alone, then for the weight gradient alone), each the
// median of its repetitions after a warm-up. The rate that matters to the
// planner is the model's: every shape weighted by how often a micro-batch
// runs it.
#pragma once

#include <vector>

#include "calibrate/model_linears.h"
#include "core/tensor.h"

namespace trainer {

struct MatmulTimingOptions {
  int warmup = 1;
  int repetitions = 5;
  // A shape stops repeating once its timed calls took this long (a large
  // model on a CPU: one call may take seconds); at least one is timed.
  double budget_s = 2.0;
  // Short products repeat until their timed calls took this long (the
  // three products of a shape share it).
  double min_s = 0.3;
};

struct MatmulTiming {
  LinearShape shape;
  double forward_s = 0, backward_input_s = 0, backward_weight_s = 0;
  double seconds() const { return forward_s + backward_input_s + backward_weight_s; }
  double flop_per_s() const { return 3 * shape.flops() / seconds(); }
};

// Bytes time_linears allocates at once for the largest shape.
int64_t linear_buffer_bytes(const std::vector<LinearShape>& shapes, DType storage);

std::vector<MatmulTiming> time_linears(const std::vector<LinearShape>& shapes, Device device, DType storage,
                                       const MatmulTimingOptions& o);

// FLOP/s of the model's matmuls: the shapes' FLOPs over their time, each
// weighted by its count.
double model_matmul_rate(const std::vector<MatmulTiming>& timings);

}  // namespace trainer
