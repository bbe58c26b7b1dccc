#include "train/run_saver.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "checkpoint/fault_injection.h"
#include "runtime/watchdog.h"
#include "train/checkpointing.h"
#include "train/engine.h"
#include "train/stage_models.h"
#include "train/test_hooks.h"

namespace trainer {

RunSaver::RunSaver(const Config& cfg, std::string root, CheckpointGroup group, int rank, int world_size, int nodes,
                   bool lead,
                   bool quiet, Watchdog* watchdog, RunIdentity identity)
    : cfg_(cfg),
      root_(root),
      rank_(rank),
      world_size_(world_size),
      nodes_(nodes),
      quiet_(quiet),
      interval_(cfg.checkpoint.interval),
      watchdog_(watchdog),
      identity_(std::move(identity)),
      kill_in_save_step_(test_hooks_for(rank).kill_in_save_step),
      writer_(std::move(root), cfg.checkpoint.keep_last, cfg.checkpoint.async, group, cfg.checkpoint.on_save_error,
              lead) {}

bool RunSaver::maybe_save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool last,
                          TrainSummary& summary) {
  if (!due(step, last)) return false;
  owed_ = false;
  save(models, step, tokens, data_offset, true, !last, summary);
  return true;
}

void RunSaver::owe(int64_t step) {
  if (at_interval(step)) owed_ = true;
}

bool RunSaver::confirm(bool applied, bool flagged, TrainSummary& summary) {
  if (!held_) return false;
  if (flagged) {
    if (!quiet_)
      std::printf("checkpoint: the snapshot of step %lld is dropped: the step run on its state was flagged\n",
                  (long long)held_->snap.meta.step);
    held_.reset();
    return false;
  }
  if (!applied) return false;
  Held h = std::move(*held_);
  held_.reset();
  h.snap.meta.verdict = kVerdictHealthy;
  write(std::move(h), summary);
  return true;
}

void RunSaver::save_on_exit(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset,
                            TrainSummary& summary) {
  if (!summary.checkpoints.empty() && summary.checkpoints.back() == root_ + "/" + checkpoint_dir_name(step)) return;
  if (held_ && held_->snap.meta.step == step) {  // this step's interval snapshot: no step will confirm it now
    Held h = std::move(*held_);
    held_.reset();
    h.announce = false;
    write(std::move(h), summary);
    return;
  }
  save(models, step, tokens, data_offset, false, false, summary);
}

void RunSaver::save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool announce, bool hold,
                    TrainSummary& summary) {
  if (watchdog_) watchdog_->progress(step, "checkpoint");
  const auto c0 = std::chrono::steady_clock::now();
  Held h;
  h.snap = take_snapshot(cfg_, models.states(), step, tokens, rank_, world_size_);
  h.snap.meta.data_offset = data_offset;
  h.snap.meta.nodes = nodes_;
  h.snap.meta.identity = identity_;
  h.snap.meta.verdict = kVerdictUnconfirmed;
  h.snap_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  h.announce = announce;
  if (hold)
    held_ = std::move(h);
  else
    write(std::move(h), summary);
}

bool RunSaver::write(Held h, TrainSummary& summary) {
  const std::string name = root_ + "/" + checkpoint_dir_name(h.snap.meta.step);
  if (kill_in_save_step_ == h.snap.meta.step)
    checkpoint_inject_fault({"rank_file", ENOSPC, 0, 1, true});
  const bool started = writer_.save(std::move(h.snap));  // [ckpt-integrity] false: failed, on_save_error=continue
  if (started) summary.checkpoints.push_back(name);
  if (started && h.announce && !quiet_)
    std::printf("checkpoint: %s snapshot taken in %.1f ms, %s\n", name.c_str(), h.snap_ms,
                cfg_.checkpoint.async ? "writing in the background while training continues" : "written");
  return started;
}

}  // namespace trainer
