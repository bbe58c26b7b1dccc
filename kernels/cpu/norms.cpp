// RMSNorm and LayerNorm of the CPU backend (see kernels/op_list.h). Row statistics
// are accumulated in double (row_math's lane_sum: eight fixed lanes, so the
// loops vectorize): this backend is the reference the CUDA kernels and the
// PyTorch model are judged against.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"
#include "kernels/cpu/row_math.h"
#include "core/simd_clones.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 14;

// x is [..., C] with C > 0 taken from the 1-D weight (checked by the router,
// kernels/checks/norms.cpp); returns the number of rows.
int64_t rows_of(const Tensor& x, const Tensor& weight) { return x.numel() / weight.dim(0); }

// Parameter gradients sum over rows. Threads own column slabs and walk the
// rows in order, so there is no race and the sum does not depend on the
// thread count. f(n, c) is the row-n contribution to column c.
template <class F>
void column_sums(float* acc, int64_t N, int64_t C, F f) {
  constexpr int64_t kCols = 64;
  const int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kCols, c1 = std::min(C, c0 + kCols);
    double s[kCols] = {};
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = c0; c < c1; ++c) s[c - c0] += f(n, c);
    for (int64_t c = c0; c < c1; ++c) acc[c] += float(s[c - c0]);
  }
}

// One row each, with AVX2 clones (core/simd_clones.h).

// Returns r = (mean(x^2) + eps)^-1/2; o = x r w.
TRAINER_SIMD_CLONES float rmsnorm_row(float* o, const float* xr, const float* w, int64_t C, float eps) {
  const double ss = lane_sum(C, [xr](int64_t c) { return double(xr[c]) * xr[c]; });
  const float r = float(1.0 / std::sqrt(ss / double(C) + double(eps)));
  for (int64_t c = 0; c < C; ++c) o[c] = xr[c] * r * w[c];
  return r;
}

// y = x r w with r = (mean(x^2) + eps)^-1/2, dr/dx_c = -r^3 x_c / C:
// dx_c = r w_c g_c - r^3 x_c / C * sum_j g_j w_j x_j.
TRAINER_SIMD_CLONES void rmsnorm_grad_row(float* d, const float* gr, const float* xr, const float* w, int64_t C,
                                          double r) {
  const double dot = lane_sum(C, [=](int64_t c) { return double(gr[c]) * w[c] * xr[c]; });
  const float a = float(r);
  const float b = float(r * r * r * dot / double(C));
  for (int64_t c = 0; c < C; ++c) d[c] += a * w[c] * gr[c] - b * xr[c];
}

TRAINER_SIMD_CLONES void layernorm_row(float* o, float* mean, float* rstd, const float* xr, const float* w,
                                       const float* bp, int64_t C, float eps) {
  const double m = lane_sum(C, [xr](int64_t c) { return double(xr[c]); }) / double(C);
  // Two passes: the one-pass E[x^2] - E[x]^2 loses the variance when the
  // mean is large compared with the spread.
  const double v = lane_sum(C, [xr, m](int64_t c) { return (xr[c] - m) * (xr[c] - m); });
  const double r = 1.0 / std::sqrt(v / double(C) + double(eps));
  for (int64_t c = 0; c < C; ++c) {
    const float y = float((xr[c] - m) * r) * w[c];
    o[c] = bp ? y + bp[c] : y;
  }
  *mean = float(m);
  *rstd = float(r);
}

// With xhat = (x - mean) r and gh = g w:
// dx = r (gh - mean(gh) - xhat mean(gh xhat)).
TRAINER_SIMD_CLONES void layernorm_grad_row(float* d, const float* gr, const float* xr, const float* w, int64_t C,
                                            double m, double r) {
  const double sg = lane_sum(C, [=](int64_t c) { return double(gr[c]) * w[c]; }) / double(C);
  const double sgx = lane_sum(C, [=](int64_t c) { return double(gr[c]) * w[c] * (xr[c] - m) * r; }) / double(C);
  for (int64_t c = 0; c < C; ++c) {
    const double xhat = (xr[c] - m) * r;
    d[c] += float(r * (double(gr[c]) * w[c] - sg - xhat * sgx));
  }
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  const char* op = "rmsnorm_forward";
  need_f32(op, {{"out", &out}, {"x", &x}, {"weight", &weight}});
  const int64_t N = rows_of(x, weight), C = weight.dim(0);
  const float* xp = x.f32();
  const float* w = weight.f32();
  float* o = out.f32();
  float* rs = rstd.f32();
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) rs[n] = rmsnorm_row(o + n * C, xp + n * C, w, C, eps);
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                      Tensor rstd) {
  const char* op = "rmsnorm_backward";
  need_f32(op, {{"dx", &dx}, {"dweight", &dweight}, {"dout", &dout}, {"x", &x}, {"weight", &weight}});
  const int64_t N = rows_of(x, weight), C = weight.dim(0);
  const float* xp = x.f32();
  const float* w = weight.f32();
  const float* g = dout.f32();
  const float* rs = rstd.f32();
  float* dxp = dx.f32();
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) rmsnorm_grad_row(dxp + n * C, g + n * C, xp + n * C, w, C, rs[n]);
  column_sums(dweight.f32(), N, C,
              [&](int64_t n, int64_t c) { return double(g[n * C + c]) * xp[n * C + c] * rs[n]; });
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias,
                       float eps) {
  const char* op = "layernorm_forward";
  need_f32(op, {{"out", &out}, {"x", &x}, {"weight", &weight}, {"bias", &bias}});
  const int64_t N = rows_of(x, weight), C = weight.dim(0);
  const float* xp = x.f32();
  const float* w = weight.f32();
  const float* bp = bias.empty() ? nullptr : bias.f32();
  float* o = out.f32();
  float* mu = mean.f32();
  float* rs = rstd.f32();
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) layernorm_row(o + n * C, mu + n, rs + n, xp + n * C, w, bp, C, eps);
}

void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                        Tensor weight, Tensor mean, Tensor rstd) {
  const char* op = "layernorm_backward";
  need_f32(op, {{"dx", &dx},
                {"dweight", &dweight},
                {"dbias", &dbias},
                {"dout", &dout},
                {"x", &x},
                {"weight", &weight}});
  const int64_t N = rows_of(x, weight), C = weight.dim(0);
  const float* xp = x.f32();
  const float* w = weight.f32();
  const float* g = dout.f32();
  const float* mu = mean.f32();
  const float* rs = rstd.f32();
  float* dxp = dx.f32();
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) layernorm_grad_row(dxp + n * C, g + n * C, xp + n * C, w, C, mu[n], rs[n]);
  column_sums(dweight.f32(), N, C, [&](int64_t n, int64_t c) {
    return double(g[n * C + c]) * ((xp[n * C + c] - double(mu[n])) * rs[n]);
  });
  if (!dbias.empty())
    column_sums(dbias.f32(), N, C, [&](int64_t n, int64_t c) { return double(g[n * C + c]); });
}

}  // namespace trainer::cpu
