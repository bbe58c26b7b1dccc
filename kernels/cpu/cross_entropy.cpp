// Fused softmax cross-entropy of the CPU backend (see kernels/op_list.h): one pass
// over each row for the log-sum-exp, one more to write the gradient, and no
// [N, V] probability tensor, so dlogits can overwrite logits in place.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

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
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, row[j]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - mx);
    const double lse = double(mx) + std::log(sum);
    // Read before the gradient pass: drow may be row itself.
    const double target_logit = row[t];
    loss[n] = float(lse - target_logit);
    if (drow) {
      for (int64_t j = 0; j < V; ++j) drow[j] = float(std::exp(double(row[j]) - lse) * grad_scale);
      // In double: p_t - 1 after rounding p_t * grad_scale to fp32 would lose
      // the digits that matter when the model is confident.
      drow[t] = float((std::exp(target_logit - lse) - 1.0) * grad_scale);
    }
  }
}

}  // namespace trainer::cpu
