// AdamW settings and the precision rule of the optimizer state. The update
// itself is ops::adamw_update_master_multi (per tensor, adamw_update /
// adamw_update_master: PyTorch's order, decoupled weight decay,
// bias-corrected moments), run by ZeroOptimizer (optim/zero.h) over the
// elements each rank owns in one call; weight decay applies only to tensors
// with two or more dimensions (ParamInfo::decay).
#pragma once

#include <vector>

#include "config/config.h"
#include "model/params.h"

namespace trainer {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  // optim.offload optimizer (ZeRO-Offload): fp32 masters, m and v of this
  // rank's pieces in host memory, the update on the host (the CPU backend's
  // AdamW on its thread pool), gradients copied to the host and the updated
  // weights back.
  bool offload = false;
};

// The optim.* keys of a run.
AdamWConfig adamw_config(const Config& cfg);

// True when the parameters are stored in BF16/F16: the optimizer then keeps
// fp32 master weights next to m and v.
bool needs_master_weights(const std::vector<ParamInfo>& params);

}  // namespace trainer
