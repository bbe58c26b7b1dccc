// Writes what the independent PyTorch reference (tests/reference) needs to
// replay a run: initial weights, every batch, step-0 logits and gradients,
// per-step losses and the final weights. Format: docs/MODEL_MATH.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "config/config.h"

namespace trainer {

class ReferenceDump {
 public:
  ReferenceDump(const std::string& dir, const Config& cfg, Model& model, int64_t micro_steps);
  // Called after the micro-batch's ids/targets are loaded, before its forward.
  void before_forward(int64_t step, int64_t micro);
  void after_step0_backward();
  void record_step(double lm_loss, double aux_loss, double lr, double grad_norm);
  void finish();

 private:
  std::vector<std::pair<std::string, Tensor>> named(const std::vector<Tensor>& ts,
                                                    const std::string& prefix) const;
  std::string dir_;
  Model& model_;
  int64_t steps_, micro_steps_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<float> logits0_, grads0_;
  std::vector<double> lm_, aux_, lr_, norm_;
};

}  // namespace trainer
