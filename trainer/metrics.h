// Per-step reporting: one human line on stdout and one JSON object per line
// in <run dir>/metrics.jsonl with the same fields.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace trainer {

struct StepMetrics {
  int64_t step = 0;          // 1-based optimizer step just finished
  int64_t total_steps = 0;
  double loss = 0, aux_loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, ms_per_step = 0;
  int64_t tokens = 0;        // tokens seen so far
  bool has_aux = false;
};

class MetricsLog {
 public:
  // jsonl_path empty: no file.
  explicit MetricsLog(const std::string& jsonl_path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void step(const StepMetrics& m, bool print);
  void eval(int64_t step, double val_loss);

 private:
  FILE* jsonl_ = nullptr;
};

}  // namespace trainer
