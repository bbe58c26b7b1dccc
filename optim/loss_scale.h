// Dynamic loss scaling for fp16: the loss is multiplied by scale() before
// backward, so small gradients survive fp16's narrow range, and the optimizer
// step divides by the same scale(). An overflow (a non-finite gradient norm)
// skips the step and halves the scale; `window` steps in a row without one
// double it. The order matters: the scale may only change after the step
// that used it, or the update would divide gradients scaled by S by 2S.
// Scales are powers of two, so scaling and unscaling are exact in floating
// point: a run with scaling equals the run without it, bit for bit, as long
// as nothing overflows.
#pragma once

#include <cstdint>

namespace trainer {

class LossScaler {
 public:
  // enabled = false: scale() stays 1 and nothing ever changes.
  LossScaler(bool enabled, double initial_scale, int64_t window);

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  // After the optimizer step that used scale(): counts a good step, and
  // doubles the scale after `window` of them in a row.
  void step_applied();
  // The gradients were not finite at this scale: the step was skipped; halve.
  void overflow();

 private:
  bool enabled_;
  double scale_;
  int64_t window_;
  int64_t good_steps_ = 0;
};

}  // namespace trainer
