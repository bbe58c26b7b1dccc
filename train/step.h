// One optimizer step of the loop and what happened to it: the micro-batches
// through this rank's schedule (pipeline/executor.h), the gradient
// reduction, the loss and norm summed over the ranks, then the verdict —
// a gradient overflow under loss scaling skips the step, a non-finite smoke
// step ends the run, the step policy (train/step_policy.h) may flag it
// (skip, roll back to the newest checkpoint, stop) — and, for a healthy
// step, the update. The loop continues at `next_step`: the next one, or
// after a rollback the checkpoint's.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "model/params.h"
#include "optim/loss_scale.h"
#include "optim/lr_schedule.h"
#include "observe/step_window.h"
#include "train/engine.h"
#include "train/session.h"
#include "train/step_policy.h"
#include "train/test_hooks.h"

namespace trainer {

enum class StepOutcome { Applied, OverflowSkipped, Flagged, RolledBack, Diverged };

struct StepResult {
  StepOutcome outcome = StepOutcome::Applied;
  int64_t next_step = 0;  // 0-based: the step the loop runs next
  double loss = 0, aux = 0, norm = 0, loss_scale = 1, lr = 0;
};

// Step `step` (1-based) prints and records its window: every log.interval
// steps and the last.
bool is_log_step(const Config& cfg, int64_t step, int64_t end_step);

class StepRunner {
 public:
  StepRunner(Session& s, StepWindow& window, TrainSummary& summary);
  // Runs step `step` (0-based); throws StepPolicyStop when the policy stops the run.
  StepResult run(int64_t step);

  bool preempt() const { return preempt_; }              // the ranks agreed to stop after this step
  int64_t completed() const { return completed_; }       // steps run, applied or skipped
  bool last_flagged() const { return last_flagged_; }    // nothing may be saved from the last step
  const std::string& last_flag() const { return last_flag_; }  // what flagged it
  bool loss_scaling() const { return scaler_.enabled(); }

 private:
  void begin(int64_t step);
  void measure(StepResult& r, double loss_sum, double aux_sum);
  // train/step_rerun.cpp: a flagged step run again (train.rerun_flagged).
  void rerun_if_flagged(int64_t step, StepResult& r);
  void forward_backward(int64_t step, double loss_scale, double& loss_sum, double& aux_sum);
  bool overflowed(int64_t step, StepResult& r);
  bool diverged(int64_t step, StepResult& r);
  bool flagged(int64_t step, StepResult& r);
  // Back to the newest checkpoint; `why` says what led there ("5 flagged
  // steps in a row"), `key` the setting that asked for it. A rollback that
  // cannot help stops the run (StepPolicyStop, or ReplicaMismatch when
  // `replicas`).
  void roll_back(int64_t step, const std::string& what, const std::string& why, const std::string& key,
                 bool replicas, StepResult& r);
  void apply(int64_t step, StepResult& r);
  // train/step_replicas.cpp: the replica check after an applied step, when due,
  // and the flip_bit test hook it is tested with.
  void check_replicas(int64_t step, StepResult& r);
  void flip_bit_hook(int64_t step);

  Session& s_;
  StepWindow& window_;
  TrainSummary& summary_;
  LrSchedule sched_;
  LossScaler scaler_;
  StepPolicy policy_;
  TestHooks hooks_;
  std::vector<ParamInfo> global_params_;
  std::chrono::steady_clock::time_point t0_;
  bool nan_fired_ = false, flip_fired_ = false, preempt_ = false, last_flagged_ = false;
  bool replica_reported_ = false;  // the first check prints its cost
  std::string last_flag_;
  double share_ = 1;  // this step's predicted_share (train/micro_batch.h)
  double local_loss_ = 0;  // this rank's loss sum of the step, before the sum over ranks
  int64_t completed_ = 0;
  // Rollbacks to the same checkpoint in a row: the third means the fault is
  // not in the data, and the run stops.
  int64_t rollback_step_ = -1, rollbacks_there_ = 0;
  // The step of an "unconfirmed" checkpoint this session resumed from, once
  // a step ran healthy on it: a rollback may go back there.
  int64_t trusted_step_ = -1;
};

}  // namespace trainer
