// GPipe: every micro-batch forward, then every micro-batch backward. All m
// micro-batches' activations are in flight at the turn; the bubble is
// (p - 1) / (m + p - 1) of the step with equal stage costs.
#include "pipeline/schedule.h"

namespace trainer {

std::vector<Action> gpipe_order(int, int, int microbatches) {
  std::vector<Action> out;
  for (int i = 0; i < microbatches; ++i) out.push_back({ActionKind::Forward, i, 0, -1});
  for (int i = 0; i < microbatches; ++i) out.push_back({ActionKind::Backward, i, 0, -1});
  return out;
}

}  // namespace trainer
