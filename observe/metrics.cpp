#include "observe/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

#include <utility>
#include <vector>

#include "observe/tensorboard.h"

namespace trainer {

namespace {
// JSON has no NaN/Inf; null keeps the file parseable when a run diverges.
std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", v);  // exact: resumed runs are compared bit for bit
  return b;
}
}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append, const std::string& progress,
                       const std::string& tensorboard_dir) {
  bar_ = progress == "bar" || (progress == "auto" && ::isatty(STDOUT_FILENO));
  if (!tensorboard_dir.empty()) tb_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
  if (path.empty()) return;
  // Always appending: a rollback trims the file under the open log
  // (train/session.h trim_metrics), and rows must go on at its new end.
  if (!append)
    if (std::FILE* f = std::fopen(path.c_str(), "w")) std::fclose(f);
  jsonl_ = std::fopen(path.c_str(), "a");
  if (!jsonl_) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  clear_bar();
  if (jsonl_) std::fclose(jsonl_);
}

void MetricsLog::clear_bar() {
  if (!bar_drawn_) return;
  std::printf("\r\033[K");
  bar_drawn_ = false;
}

void MetricsLog::progress(const StepMetrics& m) {
  if (!bar_) return;
  const double eta = m.ms_per_step * double(m.total_steps - m.step) / 1e3;
  const int width = 24;
  const int filled = m.total_steps > 0 ? int(width * m.step / m.total_steps) : 0;
  std::printf("\r[%.*s%*s] %lld/%lld | loss %.4f | %.0f tok/s | ETA %dm%02ds\033[K", filled,
              "########################", width - filled, "", (long long)m.step,
              (long long)m.total_steps, m.loss, m.tokens_per_s, int(eta) / 60, int(eta) % 60);
  std::fflush(stdout);
  bar_drawn_ = true;
}

void MetricsLog::step(const StepMetrics& m, bool print) {
  if (print) {
    clear_bar();
    std::printf("step %6lld/%lld | loss %.4f", (long long)m.step, (long long)m.total_steps, m.loss);
    if (m.has_aux) std::printf(" | aux %.4f", m.aux_loss);
    std::printf(" | lr %.3e | grad norm %.3f", m.lr, m.grad_norm);
    if (m.loss_scale > 0) std::printf(" | loss scale %g", m.loss_scale);
    std::printf(" | %.0f tok/s | %.1f ms/step", m.tokens_per_s, m.ms_per_step);
    if (m.tflops > 0) std::printf(" | %.3g TFLOP/s/device", m.tflops);
    if (m.mfu >= 0) std::printf(" | MFU %.1f%%", 100 * m.mfu);
    std::printf("\n");
    std::fflush(stdout);
  }
  if (jsonl_) {
    std::fprintf(jsonl_,
                 "{\"step\": %lld, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"tokens_per_s\": %s, "
                 "\"ms_per_step\": %s, \"tokens\": %lld%s%s%s%s%s%s%s%s}\n",
                 (long long)m.step, num(m.loss).c_str(), num(m.lr).c_str(), num(m.grad_norm).c_str(),
                 num(m.tokens_per_s).c_str(), num(m.ms_per_step).c_str(), (long long)m.tokens,
                 m.has_aux ? ", \"aux_loss\": " : "", m.has_aux ? num(m.aux_loss).c_str() : "",
                 m.loss_scale > 0 ? ", \"loss_scale\": " : "", m.loss_scale > 0 ? num(m.loss_scale).c_str() : "",
                 m.tflops > 0 ? ", \"tflops_per_device\": " : "", m.tflops > 0 ? num(m.tflops).c_str() : "",
                 m.mfu >= 0 ? ", \"mfu\": " : "", m.mfu >= 0 ? num(m.mfu).c_str() : "");
    std::fflush(jsonl_);
  }
  tensorboard_step(m);
}

void MetricsLog::tensorboard_step(const StepMetrics& m) {
  if (!tb_) return;
  // Tags group as "train" and "val" in TensorBoard's scalar dashboard; the
  // names are metrics.jsonl's.
  std::vector<std::pair<std::string, double>> v = {{"train/loss", m.loss},
                                                   {"train/lr", m.lr},
                                                   {"train/grad_norm", m.grad_norm},
                                                   {"train/tokens_per_s", m.tokens_per_s}};
  if (m.has_aux) v.emplace_back("train/aux_loss", m.aux_loss);
  if (m.loss_scale > 0) v.emplace_back("train/loss_scale", m.loss_scale);
  if (m.tflops > 0) v.emplace_back("train/tflops_per_device", m.tflops);
  if (m.mfu >= 0) v.emplace_back("train/mfu", m.mfu);
  tb_->scalars(m.step, v);
}

void MetricsLog::record(const std::string& json) {
  if (!jsonl_) return;
  std::fprintf(jsonl_, "%s\n", json.c_str());
  std::fflush(jsonl_);
}

void MetricsLog::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (tb_) tb_->scalars(step, values);
}

void MetricsLog::eval(int64_t step, double val_loss) {
  clear_bar();
  std::printf("eval @ step %lld | val loss %.4f\n", (long long)step, val_loss);
  std::fflush(stdout);
  if (jsonl_) {
    std::fprintf(jsonl_, "{\"step\": %lld, \"val_loss\": %s}\n", (long long)step, num(val_loss).c_str());
    std::fflush(jsonl_);
  }
  if (tb_) tb_->scalars(step, {{"val/loss", val_loss}});
}

void MetricsLog::task(int64_t step, const std::string& name, int64_t examples, double acc, double acc_norm) {
  clear_bar();
  std::printf("eval @ step %lld | task %s: %lld examples, acc %.4f, acc_norm %.4f\n", (long long)step, name.c_str(),
              (long long)examples, acc, acc_norm);
  std::fflush(stdout);
  if (jsonl_) {
    std::fprintf(jsonl_, "{\"step\": %lld, \"task_acc\": %s, \"task_acc_norm\": %s}\n", (long long)step,
                 num(acc).c_str(), num(acc_norm).c_str());
    std::fflush(jsonl_);
  }
  if (tb_) tb_->scalars(step, {{"task/acc", acc}, {"task/acc_norm", acc_norm}});
}

}  // namespace trainer
