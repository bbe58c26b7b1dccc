// Global gradient norm over every gradient tensor, and the clip factor
// min(1, max_norm / (norm + 1e-6)) that torch.nn.utils.clip_grad_norm_ uses.
#pragma once

#include <vector>

#include "kernels/tensor.h"

namespace trainer {

double global_grad_norm(const std::vector<Tensor>& grads);
double clip_factor(double norm, double max_norm);  // max_norm <= 0: 1

}  // namespace trainer
