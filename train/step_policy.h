// Whether a step's update may be applied (docs/ARCHITECTURE.md "Steps that
// go wrong"): a NaN/Inf loss or global gradient norm, or a loss spike (its
// z-score against the last healthy steps above train.spike_zscore), flags
// the step. Every rank judges the same all-reduced loss and norm, so every
// rank reaches the same verdict without a collective.
//
//   train.nonfinite = skip      skip the update, up to nonfinite_limit
//                               flagged steps in a row; one more: stop
//                   = rollback  skip likewise; one more: go back to the
//                               newest complete checkpoint and skip the
//                               data of the steps since
//                   = stop      stop at the first flagged step
//
// A flagged step never writes a checkpoint (its interval's save waits for
// the next healthy step), so `latest` never names an exploded model.
#pragma once

#include <cstdint>
#include <deque>
#include <stdexcept>
#include <string>

#include "config/config.h"

namespace trainer {

// The policy stopped the run (exit kStoppedByPolicyExitCode).
struct StepPolicyStop : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline constexpr int kStoppedByPolicyExitCode = 4;

enum class StepFlag { Healthy, NonFinite, Spike };
enum class StepAction { Apply, Skip, Rollback, Stop };

// "loss NaN", "gradient norm inf", "loss spike: 9.1 is 14.2 standard deviations above ..."
struct StepVerdict {
  StepFlag flag = StepFlag::Healthy;
  StepAction action = StepAction::Apply;
  std::string why;
  int64_t in_a_row = 0;  // flagged steps in a row, this one included
};

class StepPolicy {
 public:
  explicit StepPolicy(const TrainConfig& t);
  // Judges one step and, when healthy, adds its loss to the window.
  StepVerdict judge(double loss, double grad_norm);
  // A step flagged from outside (test hook), counted like a non-finite one.
  StepVerdict flag(const std::string& why);
  // After a rollback: the window and the count start again.
  void reset();
  const std::string& mode() const { return mode_; }

 private:
  std::string mode_;
  int64_t limit_;
  double zmax_;
  size_t window_;
  std::deque<double> losses_;
  int64_t in_a_row_ = 0;
  StepVerdict act(StepVerdict v);
};

}  // namespace trainer
