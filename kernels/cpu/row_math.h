// Reductions over one row of floats, shared by the softmax of attention, the
// cross-entropy, the norms and the gradient norm.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/cpu/fast_exp.h"

namespace trainer::cpu {

// Eight independent accumulators: one running max or sum would be a single
// dependency chain, bound by latency rather than throughput.
inline float row_max(const float* x, int64_t n) {
  float m[8];
  std::fill(m, m + 8, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], x[j + l]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return *std::max_element(m, m + 8);
}

// sum_j e^(x_j - ref) in double (a vocabulary is 50k terms), eight
// accumulators again; kWrite also stores each term in e (which may be x), so
// a softmax takes its exps and their sum in one pass.
template <bool kWrite>
inline double exp_sum(float* e, const float* x, int64_t n, float ref) {
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

// sum_{i < n} f(i) in double over eight accumulators in a fixed lane order,
// so the compiler can put the lanes on SIMD registers without reassociating
// anything: the result depends on n only, never on the thread count or ISA.
template <class F>
inline double lane_sum(int64_t n, F f) {
  double s[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[l] += f(i + l);
  for (; i < n; ++i) s[0] += f(i);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace trainer::cpu
