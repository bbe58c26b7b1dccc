// The clip factor min(1, max_norm / (norm + 1e-6)) that
// torch.nn.utils.clip_grad_norm_ uses; the global norm itself comes from
// ZeroOptimizer::grad_sum_squares (every rank's shard, summed).
#pragma once

namespace trainer {

double clip_factor(double norm, double max_norm);  // max_norm <= 0: 1

}  // namespace trainer
