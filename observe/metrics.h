// Per-step reporting: one human line on stdout every log.interval steps, one
// JSON object per line in <run dir>/metrics.jsonl with the same fields, and
// on a terminal a progress line (step/total, ETA, tokens/s) redrawn in place;
// with log.tensorboard, the same scalars as TensorBoard events
// (observe/tensorboard.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

class TensorBoardWriter;

struct StepMetrics {
  int64_t step = 0;          // 1-based optimizer step just finished
  int64_t total_steps = 0;
  double loss = 0, aux_loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_s = 0, ms_per_step = 0;
  int64_t tokens = 0;        // tokens seen so far
  bool has_aux = false;
  double loss_scale = 0;     // > 0: dynamic loss scaling is on (the scale this step used)
  double tflops = 0;         // model TFLOP/s per device (observe/step_time.h); 0: not shown
  double mfu = -1;           // share of the device's peak; < 0: peak unknown, not shown
};

class MetricsLog {
 public:
  // jsonl_path empty: no file. append: continue a resumed run's file.
  // progress: auto (a bar when stdout is a terminal) | bar | lines.
  // tensorboard_dir: where step() and eval() also write TensorBoard events
  // (a new event file each run); empty: none.
  MetricsLog(const std::string& jsonl_path, bool append, const std::string& progress,
             const std::string& tensorboard_dir = "");
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void step(const StepMetrics& m, bool print);
  void eval(int64_t step, double val_loss);
  // A multiple-choice task's scores (train.eval_task; infer/choice_score.h).
  void task(int64_t step, const std::string& name, int64_t examples, double acc, double acc_norm);
  // One more JSON object (a line of metrics.jsonl), e.g. the experts' load.
  void record(const std::string& json);
  // TensorBoard scalars only (no-op without log.tensorboard).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // Between log lines: redraws the progress line (no-op in lines mode).
  void progress(const StepMetrics& m);

 private:
  void clear_bar();
  void tensorboard_step(const StepMetrics& m);
  FILE* jsonl_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
  bool bar_ = false;
  bool bar_drawn_ = false;
};

}  // namespace trainer
