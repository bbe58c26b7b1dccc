// 1F1B (PipeDream-flush, Megatron's default): rank r runs p - r - 1 warm-up
// forwards, then alternates one forward and one backward, then drains the
// remaining backwards. The bubble is the same as GPipe's, (p - 1) / (m + p
// - 1) with equal stage costs, but rank r holds at most p - r micro-batches
// of activations instead of m.
#include <algorithm>

#include "pipeline/schedule.h"

namespace trainer {

std::vector<Action> one_f_one_b_order(int stages, int rank, int microbatches) {
  const int warmup = std::min(stages - rank - 1, microbatches);
  std::vector<Action> out;
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back({ActionKind::Forward, f, 0, -1});
  for (; f < microbatches; ++f, ++b) {
    out.push_back({ActionKind::Forward, f, 0, -1});
    out.push_back({ActionKind::Backward, b, 0, -1});
  }
  for (; b < microbatches; ++b) out.push_back({ActionKind::Backward, b, 0, -1});
  return out;
}

}  // namespace trainer
