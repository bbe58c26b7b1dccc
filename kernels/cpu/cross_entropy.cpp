// Softmax cross-entropy of the CPU backend (see kernels/op_list.h), fused and
// vocabulary-parallel, with no [N, V] probability tensor, so dlogits can
// overwrite logits in place. Per row: one pass for the max, one that takes
// e^(x - max) once per logit (vectorized, row_math.h) into the sum and, when
// a gradient is wanted, into its row, and one that scales that row. At the
// GPT-2 vocabulary this op was two double-precision libm exps per logit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"
#include "kernels/cpu/row_math.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

// The target column of a gradient row, p_t - 1, in double: rounding p_t *
// grad_scale to fp32 first would lose the digits that matter when the model
// is confident.
void target_gradient(float* drow, int64_t t, int64_t cols, double lse, double target_logit, float grad_scale) {
  if (t >= 0 && t < cols) drow[t] = float((std::exp(target_logit - lse) - 1.0) * grad_scale);
}

// The exponent's reference of a row with max mx: logits that are all -inf
// carry no probability (s = 0, as for no columns; the other ranks' columns
// still count), not the NaN of exp(-inf - -inf); measured from 0 then, a NaN
// logit still makes s NaN.
float exp_ref(float mx) { return mx == -std::numeric_limits<float>::infinity() ? 0.f : mx; }

}  // namespace

void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                    float grad_scale) {
  const char* op = "cross_entropy_forward_backward";
  need_f32(op, {{"logits", &logits}, {"dlogits", &dlogits}});
  const int64_t V = logits.dim(-1);
  const int64_t N = V > 0 ? logits.numel() / V : 0;
  const int32_t* tg = targets.i32();
  // Checked up front: a throw cannot leave an OpenMP loop, and a bad target
  // must not leave half the rows overwritten.
  for (int64_t n = 0; n < N; ++n)
    if (tg[n] >= V)
      checks::fail(op, "target " + std::to_string(tg[n]) + " at row " + std::to_string(n) +
                   " is outside the vocabulary [0, " + std::to_string(V) + ")");

  const float* x = logits.f32();
  float* loss = losses.f32();
  float* dx = dlogits.empty() ? nullptr : dlogits.f32();
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * V;
    float* drow = dx ? dx + n * V : nullptr;
    const int32_t t = tg[n];
    if (t < 0) {
      loss[n] = 0.f;
      if (drow) std::fill(drow, drow + V, 0.f);
      continue;
    }
    const float mx = row_max(row, V);
    // Read before the exp pass: drow may be row itself.
    const double target_logit = row[t];
    const double sum = drow ? exp_sum_into(drow, row, V, mx) : exp_sum(row, V, mx);
    const double lse = double(mx) + std::log(sum);
    loss[n] = float(lse - target_logit);
    if (!drow) continue;
    const float scale = float(grad_scale / sum);
    for (int64_t j = 0; j < V; ++j) drow[j] *= scale;
    target_gradient(drow, t, V, lse, target_logit, grad_scale);
  }
}

void cross_entropy_partial_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                                 int64_t valid_cols, int64_t vocab_size) {
  const char* op = "cross_entropy_partial_stats";
  need_f32(op, {{"logits", &logits}});
  const int64_t N = targets.numel(), Vl = logits.dim(-1);
  const int32_t* tg = targets.i32();
  // Up front, as in the fused op: no half-written stats on a bad target.
  for (int64_t n = 0; n < N; ++n)
    if (tg[n] >= vocab_size)
      checks::fail(op, "target " + std::to_string(tg[n]) + " at row " + std::to_string(n) +
                   " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");

  const float* x = logits.f32();
  float* st = stats.f32();
#pragma omp parallel for schedule(static) if (N * valid_cols >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * Vl;
    const float mx = row_max(row, valid_cols);
    const float ref = exp_ref(mx);
    const double sum = exp_sum(row, valid_cols, ref);
    const int64_t local = int64_t(tg[n]) - vocab_offset;
    const bool held = tg[n] >= 0 && local >= 0 && local < valid_cols;
    st[3 * n + 0] = mx;
    st[3 * n + 1] = float(sum);
    st[3 * n + 2] = held ? row[local] : 0.f;
  }
}

void cross_entropy_vocab_parallel(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                  Tensor all_stats, int64_t vocab_offset, int64_t valid_cols,
                                  float grad_scale) {
  const char* op = "cross_entropy_vocab_parallel";
  need_f32(op, {{"logits", &logits}, {"dlogits", &dlogits}});
  const int64_t N = targets.numel(), Vl = logits.dim(-1), P = all_stats.dim(0);
  const int32_t* tg = targets.i32();
  const float* x = logits.f32();
  const float* st = all_stats.f32();
  float* loss = losses.f32();
  float* dx = dlogits.empty() ? nullptr : dlogits.f32();
#pragma omp parallel for schedule(static) if (N * std::max<int64_t>(Vl, P) >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x + n * Vl;
    float* drow = dx ? dx + n * Vl : nullptr;
    const int32_t t = tg[n];
    if (t < 0) {
      loss[n] = 0.f;
      if (drow) std::fill(drow, drow + Vl, 0.f);
      continue;
    }
    double M = -std::numeric_limits<double>::infinity();
    for (int64_t p = 0; p < P; ++p) M = std::max(M, double(st[(p * N + n) * 3]));
    double sum = 0, target_logit = 0;
    for (int64_t p = 0; p < P; ++p) {
      const float* sp = st + (p * N + n) * 3;
      // A rank without valid columns has m = -inf, s = 0: exp(-inf - M)
      // would be NaN when M is -inf too.
      if (sp[1] != 0.f) sum += double(sp[1]) * std::exp(double(sp[0]) - M);
      target_logit += sp[2];
    }
    // No probability anywhere (every logit -inf) is NaN, as in the fused op;
    // so is a NaN target logit (CUDA's mark of a target outside the
    // vocabulary), which must reach the gradient row too.
    const double lse = sum > 0 && !std::isnan(target_logit)
                           ? M + std::log(sum)
                           : std::numeric_limits<double>::quiet_NaN();
    loss[n] = float(lse - target_logit);
    if (!drow) continue;
    // e^(x - lse) as e^(x - m_here) e^(m_here - lse): the exponent of the
    // vectorized pass stays a float difference of logits.
    const float here = row_max(row, valid_cols);
    const float ref = exp_ref(here);
    exp_sum_into(drow, row, valid_cols, ref);
    const float scale = float(std::exp(double(ref) - lse) * grad_scale);
    for (int64_t j = 0; j < valid_cols; ++j) drow[j] *= scale;
    target_gradient(drow, int64_t(t) - vocab_offset, valid_cols, lse, target_logit, grad_scale);
    std::fill(drow + valid_cols, drow + Vl, 0.f);  // padding columns
  }
}

}  // namespace trainer::cpu
