// Whether a step's update may be applied (docs/ARCHITECTURE.md "Steps that
// go wrong"). Flagged are:
//   - a NaN/Inf loss or global gradient norm;
//   - from the first step on, a loss above train.loss_ceiling (3 ln(vocab)
//     by default: three times a uniform guess) or a gradient norm above
//     train.grad_norm_ceiling: an exploded model that is still finite;
//   - a spike: a loss or gradient norm more than train.spike_zscore robust
//     standard deviations (1.4826 x the median absolute deviation, with a
//     floor) above the median of the last healthy steps. The median and MAD
//     are not dragged along by a few large values as a mean and standard
//     deviation are.
// Every rank judges the same all-reduced loss and norm, so every rank
// reaches the same verdict without a collective.
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

enum class StepFlag { Healthy, NonFinite, Ceiling, Spike };
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
  // vocab_size: what the default loss ceiling is of (0: no default ceiling).
  explicit StepPolicy(const TrainConfig& t, int64_t vocab_size = 0);
  // Judges one step and, when healthy, adds its loss and norm to the window.
  StepVerdict judge(double loss, double grad_norm);
  // The flag judge would give, changing nothing (the action is not set).
  StepVerdict classify(double loss, double grad_norm) const;
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
  double loss_ceiling_ = 0, norm_ceiling_ = 0;  // 0: none
  std::deque<double> losses_, norms_;
  std::string spike(const char* what, double x, const std::deque<double>& history, double floor_share) const;
  int64_t in_a_row_ = 0;
  StepVerdict act(StepVerdict v);
};

}  // namespace trainer
