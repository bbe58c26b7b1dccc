#include "train/step_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace trainer {

namespace {
// Fewer healthy steps than this: too little history for a z-score.
constexpr size_t kMinHistory = 10;
// The robust standard deviation's floor, as a share of the median: a flat
// loss would make any rounding a spike. Gradient norms of healthy runs jump
// by 20x and more for a step (clipping takes those), so at the default
// z-score only a norm over ~120x the median counts: an explosion, not a bump.
constexpr double kLossFloor = 1e-3, kNormFloor = 10;

double median(std::vector<double> v) {
  const size_t k = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + long(k), v.end());
  if (v.size() % 2) return v[k];
  const double hi = v[k];
  return 0.5 * (hi + *std::max_element(v.begin(), v.begin() + long(k)));
}
}  // namespace

StepPolicy::StepPolicy(const TrainConfig& t, int64_t vocab_size)
    : mode_(t.nonfinite), limit_(t.nonfinite_limit), zmax_(t.spike_zscore), window_(size_t(t.spike_window)) {
  if (t.loss_ceiling > 0)
    loss_ceiling_ = t.loss_ceiling;
  else if (t.loss_ceiling == 0 && vocab_size > 1)
    loss_ceiling_ = 3 * std::log(double(vocab_size));
  norm_ceiling_ = t.grad_norm_ceiling > 0 ? t.grad_norm_ceiling : 0;
}

void StepPolicy::reset() {
  losses_.clear();
  norms_.clear();
  in_a_row_ = 0;
}

// "" or why x is a spike against the healthy history.
std::string StepPolicy::spike(const char* what, double x, const std::deque<double>& history,
                              double floor_share) const {
  if (zmax_ <= 0 || history.size() < std::min(window_, kMinHistory)) return "";
  const std::vector<double> h(history.begin(), history.end());
  const double med = median(h);
  std::vector<double> dev;
  dev.reserve(h.size());
  for (double v : h) dev.push_back(std::fabs(v - med));
  const double sd = std::max(1.4826 * median(dev), floor_share * std::fabs(med));
  const double z = sd > 0 ? (x - med) / sd : 0;
  if (!(z > zmax_)) return "";
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "%s spike: %.6g is %.1f standard deviations above the median %.6g of the last %zu healthy steps "
                "(train.spike_zscore=%g)",
                what, x, z, med, h.size(), zmax_);
  return buf;
}

StepVerdict StepPolicy::classify(double loss, double grad_norm) const {
  StepVerdict v;
  char buf[200];
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    v.flag = StepFlag::NonFinite;
    std::snprintf(buf, sizeof buf, "loss %g, gradient norm %g", loss, grad_norm);
    v.why = buf;
  } else if (std::string why = spike("loss", loss, losses_, kLossFloor); !why.empty()) {
    v.flag = StepFlag::Spike;
    v.why = why;
  } else if (std::string why = spike("gradient norm", grad_norm, norms_, kNormFloor); !why.empty()) {
    v.flag = StepFlag::Spike;
    v.why = why;
  } else if (loss_ceiling_ > 0 && loss > loss_ceiling_) {
    v.flag = StepFlag::Ceiling;
    std::snprintf(buf, sizeof buf, "loss %g is above train.loss_ceiling %g: an exploded model", loss, loss_ceiling_);
    v.why = buf;
  } else if (norm_ceiling_ > 0 && grad_norm > norm_ceiling_) {
    v.flag = StepFlag::Ceiling;
    std::snprintf(buf, sizeof buf, "gradient norm %g is above train.grad_norm_ceiling %g: an exploded model",
                  grad_norm, norm_ceiling_);
    v.why = buf;
  }
  return v;
}

StepVerdict StepPolicy::judge(double loss, double grad_norm) {
  StepVerdict v = classify(loss, grad_norm);
  if (v.flag == StepFlag::Healthy) {
    in_a_row_ = 0;
    losses_.push_back(loss);
    norms_.push_back(grad_norm);
    if (losses_.size() > window_) losses_.pop_front();
    if (norms_.size() > window_) norms_.pop_front();
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
