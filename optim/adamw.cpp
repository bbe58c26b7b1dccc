#include "optim/adamw.h"

#include "kernels/ops.h"

namespace trainer {

size_t adamw_state_bytes(const std::vector<ParamInfo>& params) {
  return 2 * arena_bytes(specs_of(params));
}

void adamw_init(AdamWState& s, const AdamWConfig& cfg, const std::vector<ParamInfo>& params,
                Device device) {
  s.cfg = cfg;
  const auto specs = specs_of(params);
  s.arena = Arena("optimizer state", adamw_state_bytes(params), device);
  s.m = s.arena.alloc_all(specs);
  s.v = s.arena.alloc_all(specs);
  s.step = 0;
}

void adamw_step(AdamWState& s, const std::vector<ParamInfo>& params,
                const std::vector<Tensor>& weights, const std::vector<Tensor>& grads, double lr,
                double grad_scale) {
  s.step += 1;
  for (size_t i = 0; i < params.size(); ++i) {
    ops::AdamWStep st{float(lr),
                      float(s.cfg.beta1),
                      float(s.cfg.beta2),
                      float(s.cfg.eps),
                      params[i].decay ? float(s.cfg.weight_decay) : 0.f,
                      s.step,
                      float(grad_scale)};
    ops::adamw_update(weights[i], grads[i], s.m[i], s.v[i], st);
  }
}

}  // namespace trainer
