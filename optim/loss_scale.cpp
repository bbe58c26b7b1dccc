#include "optim/loss_scale.h"

#include <stdexcept>
#include <string>

namespace trainer {

LossScaler::LossScaler(bool enabled, double initial_scale, int64_t window)
    : enabled_(enabled), scale_(enabled ? initial_scale : 1.0), window_(window) {
  if (enabled && !(initial_scale > 0))
    throw std::invalid_argument("LossScaler: initial scale " + std::to_string(initial_scale) + " must be positive");
  if (enabled && window < 1)
    throw std::invalid_argument("LossScaler: growth window " + std::to_string(window) + " must be at least 1");
}

void LossScaler::step_applied() {
  if (!enabled_) return;
  if (++good_steps_ % window_ == 0) scale_ *= 2;
}

void LossScaler::overflow() {
  if (!enabled_) return;
  scale_ /= 2;
  good_steps_ = 0;
}

}  // namespace trainer
