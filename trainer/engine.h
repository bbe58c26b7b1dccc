// The training loop: micro-batches with gradient accumulation, global-norm
// clipping, the LR schedule, AdamW, periodic evaluation and metrics.
#pragma once

#include <string>
#include <vector>

#include "trainer/config.h"

namespace trainer {

struct RunOptions {
  std::string dump_reference_dir;  // non-empty: write the reference dump (docs/MODEL_MATH.md)
  bool quiet = false;              // no per-step lines (tests)
};

struct TrainSummary {
  std::vector<double> losses;      // lm loss per step
  std::vector<double> val_losses;  // per eval
  double final_val_loss = -1;
};

// Runs the whole training; throws ConfigError for user mistakes and
// std::runtime_error for data/IO/divergence problems.
TrainSummary run_training(const Config& cfg, const RunOptions& opt);

}  // namespace trainer
