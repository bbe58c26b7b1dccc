#include "train/run_saver.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "runtime/watchdog.h"
#include "train/checkpointing.h"
#include "train/engine.h"
#include "train/stage_models.h"

namespace trainer {

RunSaver::RunSaver(const Config& cfg, std::string root, CheckpointGroup group, int rank, int world_size, bool lead,
                   bool quiet, Watchdog* watchdog)
    : cfg_(cfg),
      root_(root),
      rank_(rank),
      world_size_(world_size),
      quiet_(quiet),
      interval_(cfg.checkpoint.interval),
      watchdog_(watchdog),
      writer_(std::move(root), cfg.checkpoint.keep_last, cfg.checkpoint.async, group, cfg.checkpoint.on_save_error,
              lead) {}

bool RunSaver::maybe_save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool last,
                          TrainSummary& summary) {
  if (!due(step, last)) return false;
  owed_ = false;
  save(models, step, tokens, data_offset, true, summary);
  return true;
}

void RunSaver::owe(int64_t step) {
  if (at_interval(step)) owed_ = true;
}

void RunSaver::save_on_exit(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset,
                            TrainSummary& summary) {
  if (!summary.checkpoints.empty() && summary.checkpoints.back() == root_ + "/" + checkpoint_dir_name(step)) return;
  save(models, step, tokens, data_offset, false, summary);
}

bool RunSaver::save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool announce,
                    TrainSummary& summary) {
  if (watchdog_) watchdog_->progress(step, "checkpoint");
  const auto c0 = std::chrono::steady_clock::now();
  Snapshot snap = take_snapshot(cfg_, models.states(), step, tokens, rank_, world_size_);
  snap.meta.data_offset = data_offset;
  const double snap_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  const std::string name = root_ + "/" + checkpoint_dir_name(step);
  const bool started = writer_.save(std::move(snap));  // [ckpt-integrity] false: failed, on_save_error=continue
  if (started) summary.checkpoints.push_back(name);
  if (started && announce && !quiet_)
    std::printf("checkpoint: %s snapshot taken in %.1f ms, %s\n", name.c_str(), snap_ms,
                cfg_.checkpoint.async ? "writing in the background while training continues" : "written");
  return started;
}

}  // namespace trainer
