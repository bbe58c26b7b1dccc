#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>

namespace trainer {

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace trainer
