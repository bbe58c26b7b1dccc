#include "optim/adamw.h"

namespace trainer {

AdamWConfig adamw_config(const Config& cfg) {
  return {cfg.optim.beta1, cfg.optim.beta2, cfg.optim.eps, cfg.optim.weight_decay, cfg.optim.offload == "optimizer"};
}

bool needs_master_weights(const std::vector<ParamInfo>& params) {
  return !params.empty() && params[0].spec.dtype != DType::F32;
}

}  // namespace trainer
