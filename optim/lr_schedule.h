// Learning rate for optimizer step s (0-based): linear warmup, then cosine,
// linear or constant decay to min_lr over decay_steps (docs/MODEL_MATH.md).
// decay_steps counts warm-up plus decay. A warm-up longer than the run keeps
// rising linearly to the last step; one as long as decay_steps or longer
// rises to lr and is followed by min_lr (cosine, linear) or lr (constant).
#pragma once

#include <cstdint>
#include <string>

namespace trainer {

struct LrSchedule {
  std::string kind = "cosine";  // cosine | linear | constant
  double lr = 3e-4, min_lr = 0;
  int64_t warmup = 0, decay_steps = 1;
};

double learning_rate(const LrSchedule& s, int64_t step);

}  // namespace trainer
