#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace trainer {

double global_grad_norm(const std::vector<Tensor>& grads) {
  double s = 0;
  for (const Tensor& g : grads) s += ops::sum_squares(g);
  return std::sqrt(s);
}

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace trainer
