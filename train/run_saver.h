// When a run saves its state, and the one way it does: the interval's save
// after an applied step (the last step's too), the save a flagged step owes
// (it never writes: the next healthy step does), and the save on the way
// out of a preempted run. Every rank writes its shard through the
// CheckpointSaver (train/checkpoint_saver.h: checkpoint.on_save_error);
// rank 0 adds the manifest once all are in.
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "train/checkpoint_saver.h"

namespace trainer {

class StageModels;
class Watchdog;
struct TrainSummary;

class RunSaver {
 public:
  RunSaver(const Config& cfg, std::string root, CheckpointGroup group, int rank, int world_size, bool lead,
           bool quiet, Watchdog* watchdog);

  // After applied step `step` (1-based): whether a save is due — at
  // checkpoint.interval, at the last step, or owed by a flagged step.
  bool due(int64_t step, bool last) const { return interval_ > 0 && (at_interval(step) || last || owed_); }
  // Saves when due. True when it saved (or tried: see CheckpointSaver::save).
  bool maybe_save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool last,
                  TrainSummary& summary);
  // A flagged step at the interval: the next healthy step saves instead.
  void owe(int64_t step);
  // A preempted run's last state, unless that step is saved already.
  void save_on_exit(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, TrainSummary& summary);

  CheckpointSaver& writer() { return writer_; }
  const std::string& root() const { return root_; }

 private:
  bool at_interval(int64_t step) const { return interval_ > 0 && step % interval_ == 0; }
  // The one snapshot-and-save path; false when the save did not start.
  bool save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool announce,
            TrainSummary& summary);

  const Config& cfg_;
  std::string root_;
  int rank_ = 0, world_size_ = 1;
  bool quiet_ = false;
  int64_t interval_ = 0;
  Watchdog* watchdog_ = nullptr;
  bool owed_ = false;
  CheckpointSaver writer_;
};

}  // namespace trainer
