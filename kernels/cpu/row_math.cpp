// The row reductions of row_math.h, each with an AVX2 clone (core/simd_clones.h).
#include "kernels/cpu/row_math.h"

#include <algorithm>
#include <limits>

#include "kernels/cpu/fast_exp.h"
#include "core/simd_clones.h"

namespace trainer::cpu {
namespace {

template <bool kWrite>
inline double exp_sum_lanes(float* e, const float* x, int64_t n, float ref) {
  double s[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) {
      const float v = fast_exp(x[j + l] - ref);
      if constexpr (kWrite) e[j + l] = v;
      s[l] += v;
    }
  for (; j < n; ++j) {
    const float v = fast_exp(x[j] - ref);
    if constexpr (kWrite) e[j] = v;
    s[0] += v;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

TRAINER_SIMD_CLONES float row_max(const float* x, int64_t n) {
  float m[8];
  std::fill(m, m + 8, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], x[j + l]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return *std::max_element(m, m + 8);
}

TRAINER_SIMD_CLONES double exp_sum_into(float* e, const float* x, int64_t n, float ref) {
  return exp_sum_lanes<true>(e, x, n, ref);
}

TRAINER_SIMD_CLONES double exp_sum(const float* x, int64_t n, float ref) {
  return exp_sum_lanes<false>(nullptr, x, n, ref);
}

TRAINER_SIMD_CLONES void softmax_grad_row(float* x, float* y, int64_t n, float lse, float delta) {
  for (int64_t j = 0; j < n; ++j) {
    x[j] = fast_exp(x[j] - lse);
    y[j] = x[j] * (y[j] - delta);
  }
}

}  // namespace trainer::cpu
