// GELU (tanh approximation) and SwiGLU of the CPU backend (see kernels/op_list.h).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"
#include "kernels/cpu/fast_exp.h"
#include "core/simd_clones.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// fast_exp: vectorizable (libm's expf is a call per element); e^(-x) overflows
// to inf for x < -88, which gives the right limit, 0.
inline float sigmoid(float x) { return 1.f / (1.f + fast_exp(-x)); }

// Threads take chunks of elements; each chunk runs one cloned loop below.
constexpr int64_t kChunk = 1 << 14;

template <class F>
void over_chunks(int64_t n, F f) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// 0.5 x (1 + tanh(u)) is evaluated as x * sigmoid(2u), the same function: for
// negative x, 1 + tanh(u) cancels to a few ulps in fp32, the sigmoid does not.
TRAINER_SIMD_CLONES void gelu_range(float* y, const float* x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi);
    y[i] = xi * sigmoid(2.f * u);
  }
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
TRAINER_SIMD_CLONES void gelu_grad_range(float* d, const float* g, const float* x, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float xi = x[i];
    const float u = kSqrt2OverPi * (xi + kGeluCubic * xi * xi * xi);
    const float du = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * xi * xi);
    const float s = sigmoid(2.f * u);
    d[i] = g[i] * (s + 2.f * xi * s * (1.f - s) * du);
  }
}

TRAINER_SIMD_CLONES void swiglu_range(float* y, const float* a, const float* b, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) y[i] = a[i] * sigmoid(a[i]) * b[i];
}

// silu'(a) = s (1 + a (1 - s)). Every input of element i is read before its
// outputs are written, so da/db may alias g, a or b elementwise.
TRAINER_SIMD_CLONES void swiglu_grad_range(float* da, float* db, const float* g, const float* a, const float* b,
                                           int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const float ai = a[i], bi = b[i], gi = g[i];
    const float s = sigmoid(ai);
    da[i] = gi * bi * s * (1.f + ai * (1.f - s));
    db[i] = gi * ai * s;
  }
}

}  // namespace

void gelu_forward(Tensor out, Tensor inp) {
  need_f32("gelu_forward", {{"out", &out}, {"inp", &inp}});
  const float* x = inp.f32();
  float* y = out.f32();
  over_chunks(inp.numel(), [=](int64_t i0, int64_t i1) { gelu_range(y, x, i0, i1); });
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  need_f32("gelu_backward", {{"dinp", &dinp}, {"dout", &dout}, {"inp", &inp}});
  const float* x = inp.f32();
  const float* g = dout.f32();
  float* d = dinp.f32();
  over_chunks(inp.numel(), [=](int64_t i0, int64_t i1) { gelu_grad_range(d, g, x, i0, i1); });
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  need_f32("swiglu_forward", {{"out", &out}, {"gate", &gate}, {"up", &up}});
  const float* a = gate.f32();
  const float* b = up.f32();
  float* y = out.f32();
  over_chunks(gate.numel(), [=](int64_t i0, int64_t i1) { swiglu_range(y, a, b, i0, i1); });
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  need_f32("swiglu_backward",
           {{"dgate", &dgate}, {"dup", &dup}, {"dout", &dout}, {"gate", &gate}, {"up", &up}});
  const float* a = gate.f32();
  const float* b = up.f32();
  const float* g = dout.f32();
  float* da = dgate.f32();
  float* db = dup.f32();
  over_chunks(gate.numel(), [=](int64_t i0, int64_t i1) { swiglu_grad_range(da, db, g, a, b, i0, i1); });
}

}  // namespace trainer::cpu
