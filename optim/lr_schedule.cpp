#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace trainer {

double learning_rate(const LrSchedule& s, int64_t step) {
  // The warm-up line holds for every step before its end, however long the
  // run: a warm-up longer than the run just never reaches the peak (warmup
  // > step >= 0 here, so the division is by a positive number).
  if (step < s.warmup) return s.lr * double(step + 1) / double(s.warmup);
  if (s.kind == "constant") return s.lr;
  // decay_steps counts warm-up plus decay: when the warm-up is as long or
  // longer, the decay window has closed by the time it ends.
  if (s.decay_steps <= s.warmup) return s.min_lr;
  const double span = double(std::max<int64_t>(1, s.decay_steps - s.warmup));
  const double r = std::clamp(double(step - s.warmup) / span, 0.0, 1.0);
  if (s.kind == "linear") return s.lr - (s.lr - s.min_lr) * r;
  return s.min_lr + 0.5 * (s.lr - s.min_lr) * (1.0 + std::cos(M_PI * r));
}

}  // namespace trainer
