// When a run saves its state, and the one way it does: the interval's save
// after an applied step (the last step's too), the save a flagged step owes
// (it never writes: the next healthy step does), and the save on the way
// out of a preempted run.
//
// A state is only known to be healthy once the next step has run on it: an
// update with a huge learning rate can explode the weights while the step
// that made it looked fine. So the interval's snapshot is held until the
// next step's verdict (`confirm`): written when that step is applied,
// dropped when it is flagged or rolled back; its manifest's verdict says
// "healthy". The last step's and the preemption's saves are written at once
// (no step follows them) as "unconfirmed", which a rollback passes over. Every rank writes its shard through the
// CheckpointSaver (train/checkpoint_saver.h: checkpoint.on_save_error);
// rank 0 adds the manifest once all are in.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/config.h"
#include "train/checkpoint_saver.h"

namespace trainer {

class StageModels;
class Watchdog;
struct TrainSummary;

class RunSaver {
 public:
  // `identity` goes into every manifest (train/run_identity.h), and `nodes`
  // (the hosts the ranks run on), which a resume on another world reports.
  RunSaver(const Config& cfg, std::string root, CheckpointGroup group, int rank, int world_size, int nodes, bool lead,
           bool quiet, Watchdog* watchdog, RunIdentity identity);

  // After applied step `step` (1-based): whether a save is due — at
  // checkpoint.interval, at the last step, or owed by a flagged step.
  bool due(int64_t step, bool last) const { return interval_ > 0 && (at_interval(step) || last || owed_); }
  // Saves when due. True when it saved (or tried: see CheckpointSaver::save).
  bool maybe_save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool last,
                  TrainSummary& summary);
  // A flagged step at the interval: the next healthy step saves instead.
  void owe(int64_t step);
  // The verdict on the state the held snapshot holds: the step run on it
  // was applied (write it), or flagged / rolled back (drop it). An overflow
  // under loss scaling says nothing of the state: the snapshot stays held.
  // True when something was written.
  bool confirm(bool applied, bool flagged, TrainSummary& summary);
  bool holding() const { return held_.has_value(); }
  // A preempted run's last state, unless that step is saved already.
  void save_on_exit(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, TrainSummary& summary);

  CheckpointSaver& writer() { return writer_; }
  const std::string& root() const { return root_; }

 private:
  bool at_interval(int64_t step) const { return interval_ > 0 && step % interval_ == 0; }
  // The one snapshot-and-save path: take it, then write it now or hold it.
  void save(StageModels& models, int64_t step, int64_t tokens, int64_t data_offset, bool announce, bool hold,
            TrainSummary& summary);
  struct Held {
    Snapshot snap;  // meta.verdict: healthy once a step ran healthy on it, else unconfirmed
    double snap_ms = 0;
    bool announce = false;
  };
  // False when the save did not start (on_save_error=continue).
  bool write(Held h, TrainSummary& summary);

  const Config& cfg_;
  std::string root_;
  int rank_ = 0, world_size_ = 1, nodes_ = 0;
  bool quiet_ = false;
  int64_t interval_ = 0;
  Watchdog* watchdog_ = nullptr;
  RunIdentity identity_;
  int64_t kill_in_save_step_ = -1;  // test hook (train/test_hooks.h)
  bool owed_ = false;
  std::optional<Held> held_;
  CheckpointSaver writer_;
};

}  // namespace trainer
