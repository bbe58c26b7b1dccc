// AdamW over the model's parameter list: fp32 moments m and v (and, under
// mixed precision, the fp32 master weights) in their own arena (the
// optimizer-state line of the memory plan); decoupled weight decay only for
// tensors with two or more dimensions.
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
  std::vector<Tensor> master;  // empty unless the weights are stored below fp32
  int64_t step = 0;            // optimizer steps taken
  bool mixed() const { return !master.empty(); }
};

// True when the parameters are stored in BF16/F16 and need fp32 masters.
bool needs_master_weights(const std::vector<ParamInfo>& params);
// Bytes of optimizer state for a parameter list (the memory plan uses this).
size_t adamw_state_bytes(const std::vector<ParamInfo>& params);
void adamw_init(AdamWState& s, const AdamWConfig& cfg, const std::vector<ParamInfo>& params,
                Device device);
// One update of every parameter; grad_scale multiplies gradients first
// (clipping, loss-scale removal).
void adamw_step(AdamWState& s, const std::vector<ParamInfo>& params,
                const std::vector<Tensor>& weights, const std::vector<Tensor>& grads, double lr,
                double grad_scale);
// The fp32 copy of parameter i that checkpoints save and restore: the master
// under mixed precision, the weight itself otherwise.
Tensor fp32_weight(const AdamWState& s, const std::vector<Tensor>& weights, size_t i);

}  // namespace trainer
