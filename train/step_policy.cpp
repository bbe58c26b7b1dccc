#include "train/step_policy.h"

#include <cmath>
#include <cstdio>

namespace trainer {

namespace {
// Fewer healthy steps than this: too little history for a z-score.
constexpr size_t kMinHistory = 10;
}  // namespace

StepPolicy::StepPolicy(const TrainConfig& t)
    : mode_(t.nonfinite), limit_(t.nonfinite_limit), zmax_(t.spike_zscore), window_(size_t(t.spike_window)) {}

void StepPolicy::reset() {
  losses_.clear();
  in_a_row_ = 0;
}

StepVerdict StepPolicy::judge(double loss, double grad_norm) {
  StepVerdict v;
  char buf[160];
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    v.flag = StepFlag::NonFinite;
    std::snprintf(buf, sizeof buf, "loss %g, gradient norm %g", loss, grad_norm);
    v.why = buf;
  } else if (zmax_ > 0 && losses_.size() >= std::min(window_, kMinHistory)) {
    double mean = 0, var = 0;
    for (double x : losses_) mean += x;
    mean /= double(losses_.size());
    for (double x : losses_) var += (x - mean) * (x - mean);
    // A floor of 1e-3 of the mean: a perfectly flat loss would make any
    // rounding a spike.
    const double sd = std::max(std::sqrt(var / double(losses_.size())), 1e-3 * std::fabs(mean));
    const double z = (loss - mean) / sd;
    if (z > zmax_) {
      v.flag = StepFlag::Spike;
      std::snprintf(buf, sizeof buf,
                    "loss spike: %.6g is %.1f standard deviations above the mean %.6g of the last %zu healthy steps "
                    "(train.spike_zscore=%g)",
                    loss, z, mean, losses_.size(), zmax_);
      v.why = buf;
    }
  }
  if (v.flag == StepFlag::Healthy) {
    in_a_row_ = 0;
    losses_.push_back(loss);
    if (losses_.size() > window_) losses_.pop_front();
    return v;
  }
  return act(v);
}

StepVerdict StepPolicy::flag(const std::string& why) {
  StepVerdict v;
  v.flag = StepFlag::NonFinite;
  v.why = why;
  return act(v);
}

StepVerdict StepPolicy::act(StepVerdict v) {
  v.in_a_row = ++in_a_row_;
  if (mode_ == "stop")
    v.action = StepAction::Stop;
  else if (in_a_row_ <= limit_)
    v.action = StepAction::Skip;
  else
    v.action = mode_ == "rollback" ? StepAction::Rollback : StepAction::Stop;
  return v;
}

}  // namespace trainer
