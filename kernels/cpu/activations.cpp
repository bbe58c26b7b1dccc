// GELU (tanh approximation) and SwiGLU of the CPU backend (see kernels/op_list.h).
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"
#include "kernels/cpu/fast_exp.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// fast_exp: vectorizable (libm's expf is a call per element); e^(-x) overflows
// to inf for x < -88, which gives the right limit, 0.
inline float sigmoid(float x) { return 1.f / (1.f + fast_exp(-x)); }

}  // namespace

// 0.5 x (1 + tanh(u)) is evaluated as x * sigmoid(2u), the same function: for
// negative x, 1 + tanh(u) cancels to a few ulps in fp32, the sigmoid does not.
void gelu_forward(Tensor out, Tensor inp) {
  need_f32("gelu_forward", {{"out", &out}, {"inp", &inp}});
  const float* x = inp.f32();
  float* y = out.f32();
  const int64_t n = inp.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi);
    y[i] = xi * sigmoid(2.f * u);
  }
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  need_f32("gelu_backward", {{"dinp", &dinp}, {"dout", &dout}, {"inp", &inp}});
  const float* x = inp.f32();
  const float* g = dout.f32();
  float* d = dinp.f32();
  const int64_t n = inp.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi);
    const float du = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * xi * xi);
    const float s = sigmoid(2.f * u);
    d[i] = g[i] * (s + 2.f * xi * s * (1.f - s) * du);
  }
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  need_f32("swiglu_forward", {{"out", &out}, {"gate", &gate}, {"up", &up}});
  const float* a = gate.f32();
  const float* b = up.f32();
  float* y = out.f32();
  const int64_t n = gate.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * sigmoid(a[i]) * b[i];
}

// silu'(a) = s (1 + a (1 - s)). Every input of element i is read before its
// outputs are written, so dgate/dup may alias dout, gate or up elementwise.
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  need_f32("swiglu_backward",
           {{"dgate", &dgate}, {"dup", &dup}, {"dout", &dout}, {"gate", &gate}, {"up", &up}});
  const float* a = gate.f32();
  const float* b = up.f32();
  const float* g = dout.f32();
  float* da = dgate.f32();
  float* db = dup.f32();
  const int64_t n = gate.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float ai = a[i], bi = b[i], gi = g[i];
    const float s = sigmoid(ai);
    da[i] = gi * bi * s * (1.f + ai * (1.f - s));
    db[i] = gi * ai * s;
  }
}

}  // namespace trainer::cpu
