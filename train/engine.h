// The training loop: micro-batches with gradient accumulation, global-norm
// clipping, the LR schedule, AdamW, periodic evaluation, metrics, checkpoints
// and resume, and the text sample at the end.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "comm/launch.h"

namespace trainer {

class DistributedRun;
class StageModels;
struct ShardingPlan;
struct TrainSummary;

// What the run hands a check that follows its last step on every rank (the
// smoke test's checkpoint round trip, verify/smoke_roundtrip.h), so the loop
// does not know the checks that use it.
struct FinishedRun {
  const Config& cfg;
  const LaunchInfo& launch;
  const std::vector<ShardingPlan>& plans;  // this rank's stage pieces
  StageModels& models;
  int64_t step = 0;    // the last optimizer step
  int64_t tokens = 0;  // tokens per micro-batch
  std::string checkpoint_root;
  DistributedRun& dist;
};

struct RunOptions {
  std::string dump_reference_dir;  // non-empty: write the reference dump (docs/MODEL_MATH.md)
  bool quiet = false;              // no per-step lines (tests)
  bool smoke = false;              // record divergence instead of throwing
  // Run after the last step unless the run diverged (the smoke test's round trip).
  std::function<void(const FinishedRun&, TrainSummary&)> after_run;
  int64_t stop_after = 0;          // > 0: stop after this optimizer step (the schedule still spans train.steps)
  LaunchInfo launch;               // world_size > 1: data-parallel ranks over the store + communicators
};

inline constexpr size_t kStepHistory = 1000;

struct TrainSummary {
  int64_t start_step = 0, end_step = 0;
  // Per step run in this process: every step of a smoke test, the first
  // kStepHistory of a run (metrics.jsonl has them all).
  std::vector<double> losses, grad_norms, step_ms;
  std::vector<double> val_losses;
  std::vector<double> loss_scales;     // the loss scale each recorded step used (1 without scaling)
  std::vector<int64_t> skipped_steps;  // steps skipped for a gradient overflow under loss scaling (1-based)
  std::vector<int64_t> flagged_steps;  // steps train.nonfinite flagged (NaN/Inf or a loss spike), 1-based
  std::vector<int64_t> rollbacks;      // steps after which the run rolled back to a checkpoint
  bool preempted = false;              // stopped on a signal after saving (exit kPreemptedExitCode)
  double final_val_loss = -1;
  bool diverged = false;
  std::string divergence;          // what went non-finite, at which step
  size_t planned_bytes = 0;
  size_t optimizer_bytes = 0;      // this rank's AdamW state as allocated (1/dp under ZeRO 1-3)
  size_t device_bytes = 0;         // GPU memory; 0 on the CPU
  std::vector<std::string> checkpoints;  // directories written, in order
  bool roundtrip_checked = false, roundtrip_ok = false;
  std::string roundtrip_detail;
  std::string sample;              // generated text, if log.sample_tokens > 0
};

// Runs the whole training; throws ConfigError for user mistakes and
// std::runtime_error for data/IO/divergence problems (divergence is recorded
// instead when opt.smoke is set).
TrainSummary run_training(const Config& cfg, const RunOptions& opt);

}  // namespace trainer
