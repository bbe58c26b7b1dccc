// Reductions over one row of floats, shared by the softmax of attention, the
// cross-entropy, the norms and the gradient norm.
#pragma once

#include <cstdint>

namespace trainer::cpu {

// Eight independent accumulators: one running max or sum would be a single
// dependency chain, bound by latency rather than throughput. These are out of
// line (row_math.cpp) so that each is one function with an AVX2 clone
// (core/simd_clones.h), shared by attention, ring attention and the cross-entropy.
float row_max(const float* x, int64_t n);

// sum_j e^(x_j - ref) in double (a vocabulary is 50k terms), eight
// accumulators again; exp_sum_into also stores each term in e (which may be
// x), so a softmax takes its exps and their sum in one pass.
double exp_sum_into(float* e, const float* x, int64_t n, float ref);
double exp_sum(const float* x, int64_t n, float ref);

// The softmax backward of one attention row from its scores x and dP = y, in
// place: x_j <- e^(x_j - lse), y_j <- x_j (y_j - delta).
void softmax_grad_row(float* x, float* y, int64_t n, float lse, float delta);

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
