// AdamW over the model's parameter list: fp32 moments m and v in their own
// arena (the optimizer-state line of the memory plan), decoupled weight decay
// only for tensors with two or more dimensions.
#pragma once

#include <vector>

#include "kernels/arena.h"
#include "model/params.h"

namespace trainer {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

struct AdamWState {
  AdamWConfig cfg;
  Arena arena;
  std::vector<Tensor> m, v;
  int64_t step = 0;  // optimizer steps taken
};

// Bytes of optimizer state for a parameter list (the memory plan uses this).
size_t adamw_state_bytes(const std::vector<ParamInfo>& params);
void adamw_init(AdamWState& s, const AdamWConfig& cfg, const std::vector<ParamInfo>& params,
                Device device);
// One update of every parameter; grad_scale multiplies gradients first (clipping).
void adamw_step(AdamWState& s, const std::vector<ParamInfo>& params,
                const std::vector<Tensor>& weights, const std::vector<Tensor>& grads, double lr,
                double grad_scale);

}  // namespace trainer
