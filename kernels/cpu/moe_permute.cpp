// MoE permute (tokens -> expert-ordered rows) and unpermute (weighted combine
// back to tokens), CPU reference. The row_map from moe_dispatch_plan is the
// only link between the two layouts.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

using checks::fail;

// The kernels below index rows straight from row_map and zero the tail
// [kept, N*K). That is only correct when the kept rows are exactly
// 0..kept-1, each used once, which is what moe_dispatch_plan produces; a map
// built any other way (or corrupted in transit) is rejected here rather than
// read out of bounds or left with stale rows. Returns kept.
int64_t check_row_map(const char* op, const Tensor& row_map) {
  const int64_t NK = row_map.numel(), K = row_map.dim(1);
  const int32_t* R = row_map.i32();
  std::vector<char> used(size_t(NK), 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < NK; ++i) {
    const int32_t r = R[i];
    if (r == -1) continue;
    if (r < 0 || r >= NK || used[size_t(r)])
      fail(op, "row_map[" + std::to_string(i / K) + "," + std::to_string(i % K) +
                   "] = " + std::to_string(r) +
                   (r >= 0 && r < NK ? " is used twice" : " is outside [-1, N*K)") + " (row_map " +
                   row_map.shape_str() + ")");
    used[size_t(r)] = 1;
    ++kept;
  }
  for (int64_t r = 0; r < kept; ++r)
    if (!used[size_t(r)])
      fail(op, "row_map " + row_map.shape_str() + " keeps " + std::to_string(kept) +
                   " assignments but row " + std::to_string(r) +
                   " is unused; rows must be 0..kept-1 as moe_dispatch_plan makes them");
  return kept;
}

}  // namespace

void moe_permute(Tensor xp, Tensor x, Tensor row_map) {
  const char* op = "moe_permute";
  need_f32(op, {{"xp", &xp}, {"x", &x}});
  const int64_t kept = check_row_map(op, row_map);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = x.dim(1);
  const float* X = x.f32();
  float* XP = xp.f32();
  const int32_t* R = row_map.i32();
#pragma omp parallel for if (N * K * C > (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = R[n * K + k];
      if (r >= 0) std::memcpy(XP + r * C, X + n * C, size_t(C) * sizeof(float));
    }
  // The tail feeds the grouped GEMMs' unused rows in some backends; zeros
  // keep stale or NaN data from ever reaching a reduction.
  if (N * K > kept) std::memset(XP + kept * C, 0, size_t((N * K - kept) * C) * sizeof(float));
}

void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map) {
  const char* op = "moe_permute_backward";
  need_f32(op, {{"dx", &dx}, {"dxp", &dxp}});
  check_row_map(op, row_map);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = dx.dim(1);
  float* DX = dx.f32();
  const float* DXP = dxp.f32();
  const int32_t* R = row_map.i32();
  // Accumulates: the MoE input also feeds the router, whose linear backward
  // writes its own share of this gradient.
#pragma omp parallel for if (N * K * C > (1 << 16))
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = R[n * K + k];
      if (r < 0) continue;
      const float* src = DXP + r * C;
      float* dst = DX + n * C;
      for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
    }
}

void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w) {
  const char* op = "moe_unpermute";
  need_f32(op, {{"y", &y}, {"yp", &yp}});
  check_row_map(op, row_map);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = y.dim(1);
  float* Y = y.f32();
  const float* YP = yp.f32();
  const float* W = topk_w.f32();
  const int32_t* R = row_map.i32();
#pragma omp parallel for if (N * K * C > (1 << 16))
  for (int64_t n = 0; n < N; ++n) {
    float* dst = Y + n * C;
    // A token whose every assignment was dropped gets y = 0: the residual
    // connection around the MoE layer carries it through unchanged.
    std::memset(dst, 0, size_t(C) * sizeof(float));
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = R[n * K + k];
      if (r < 0) continue;
      const float w = W[n * K + k];
      const float* src = YP + r * C;
      for (int64_t c = 0; c < C; ++c) dst[c] += w * src[c];
    }
  }
}

void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map,
                            Tensor topk_w) {
  const char* op = "moe_unpermute_backward";
  need_f32(op, {{"dyp", &dyp}, {"dy", &dy}, {"yp", &yp}});
  // dtopk_w may be absent when the router is not being trained (frozen, or
  // a backward pass that only wants the expert gradients).
  const bool have_dw = !dtopk_w.empty();
  const int64_t kept = check_row_map(op, row_map);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = dy.dim(1);
  float* DYP = dyp.f32();
  float* DW = have_dw ? dtopk_w.f32() : nullptr;
  const float* DY = dy.f32();
  const float* YP = yp.f32();
  const float* W = topk_w.f32();
  const int32_t* R = row_map.i32();
#pragma omp parallel for if (N * K * C > (1 << 16))
  for (int64_t n = 0; n < N; ++n) {
    const float* g = DY + n * C;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t r = R[n * K + k];
      if (r < 0) {
        if (have_dw) DW[n * K + k] = 0.f;
        continue;
      }
      const float w = W[n * K + k];
      float* dst = DYP + r * C;
      const float* src = YP + r * C;
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dst[c] = w * g[c];
        dot += double(g[c]) * double(src[c]);
      }
      if (have_dw) DW[n * K + k] = float(dot);
    }
  }
  if (N * K > kept) std::memset(DYP + kept * C, 0, size_t((N * K - kept) * C) * sizeof(float));
}

}  // namespace trainer::cpu
