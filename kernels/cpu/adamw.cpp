// AdamW of the CPU backend (kernels/op_list.h): adamw_update and
// adamw_update_master. The arithmetic follows
// torch.optim.AdamW's single-tensor path operation by operation, including
// which constants are formed in double (Python floats) and rounded to fp32
// only when they meet a tensor, so the PyTorch reference can track the
// trainer's weights over many steps.
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;
}  // namespace

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  need_f32("adamw_update", {{"grad", &grad}});

  const float decay = float(1.0 - double(s.lr) * double(s.weight_decay));
  const float w1 = float(1.0 - double(s.beta1));  // lerp weight of exp_avg toward grad
  const float b2 = s.beta2;
  const float w2 = float(1.0 - double(s.beta2));
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  const float neg_step_size = float(-(double(s.lr) / bc1));
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float eps = s.eps;
  const float gs = s.grad_scale;

  float* p = param.f32();
  const float* g = grad.f32();
  float* mp = m.f32();
  float* vp = v.f32();
  const int64_t n = param.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * gs;
    const float pi = p[i] * decay;
    // torch's lerp switches form at weight 0.5 to stay exact at both ends.
    const float mi = w1 < 0.5f ? mp[i] + w1 * (gi - mp[i]) : gi - (gi - mp[i]) * (1.f - w1);
    const float vi = vp[i] * b2 + w2 * gi * gi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = pi + neg_step_size * mi / denom;
    mp[i] = mi;
    vp[i] = vi;
  }
}

// The CPU is fp32 end to end, so the "low-precision" copy is another F32
// tensor; this twin exists so the CUDA kernel has a reference to test against.
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v,
                         const AdamWStep& s) {
  need_f32("adamw_update_master", {{"param", &param}});
  cpu::adamw_update(master, grad, m, v, s);
  if (param.data != master.data) std::memcpy(param.data, master.data, master.nbytes());
}

}  // namespace trainer::cpu
