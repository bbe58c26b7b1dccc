#include "optim/adamw.h"

#include "kernels/ops.h"

namespace trainer {

namespace {
std::vector<TensorSpec> f32_specs(const std::vector<ParamInfo>& params) {
  std::vector<TensorSpec> s = specs_of(params);
  for (auto& t : s) t.dtype = DType::F32;
  return s;
}
}  // namespace

bool needs_master_weights(const std::vector<ParamInfo>& params) {
  return !params.empty() && params[0].spec.dtype != DType::F32;
}

size_t adamw_state_bytes(const std::vector<ParamInfo>& params) {
  const size_t one = arena_bytes(f32_specs(params));
  return (needs_master_weights(params) ? 3 : 2) * one;
}

void adamw_init(AdamWState& s, const AdamWConfig& cfg, const std::vector<ParamInfo>& params,
                Device device) {
  s.cfg = cfg;
  const auto specs = f32_specs(params);
  s.arena = Arena("optimizer state", adamw_state_bytes(params), device);
  s.m = s.arena.alloc_all(specs);
  s.v = s.arena.alloc_all(specs);
  s.master.clear();
  if (needs_master_weights(params)) s.master = s.arena.alloc_all(specs);
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
    if (s.mixed())
      ops::adamw_update_master(weights[i], s.master[i], grads[i], s.m[i], s.v[i], st);
    else
      ops::adamw_update(weights[i], grads[i], s.m[i], s.v[i], st);
  }
}

Tensor fp32_weight(const AdamWState& s, const std::vector<Tensor>& weights, size_t i) {
  return s.mixed() ? s.master[i] : weights[i];
}

}  // namespace trainer
