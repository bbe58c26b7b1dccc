// The run's checkpoint saves under checkpoint.on_save_error. A save fails
// when the filesystem is full, read-only or refuses permission; the writer
// then leaves `latest` and every older checkpoint as they were
// (checkpoint/checkpoint.h), and this decides what the run does:
//   stop      (default) the run ends with exit 1 and the error, which names
//             the directory and the errno text; nothing after the last good
//             checkpoint is saved, so a resume continues from there.
//   continue  the error is printed loudly (rank 0) and training goes on; the
//             next interval tries again. Meant for runs where an hour of
//             training is worth more than one missed save.
// With checkpoint.async a background write's failure is only known at the
// next save (or at the end of the run), so under stop the run ends there.
// The last save of a run must succeed in both modes: under continue a
// failure there still exits 1, since nothing would hold the final state.
// Under several ranks every rank's save fails together (the writer's group
// protocol), so every rank stops, or every rank continues.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"

namespace trainer {

class CheckpointSaver {
 public:
  // policy: "stop" or "continue" (checkpoint.on_save_error); lead: the rank
  // that reports failures under continue.
  CheckpointSaver(std::string root, int keep_last, bool async, CheckpointGroup group, std::string policy, bool lead);

  // Saves `snap` (in the background when async), after the previous save has
  // finished. Under stop, throws std::runtime_error when the previous or this
  // save failed; under continue, reports it and returns false when this
  // save did not even start or failed.
  bool save(Snapshot snap);
  // Waits for the save in flight and applies the policy to its failure (stop:
  // throws; continue: reports). For a pause mid-run that needs the disk
  // settled, e.g. before reading the newest checkpoint back.
  void settle();
  // The end of the run: waits for the last save; throws if it failed.
  void wait();
  std::string last_completed() const { return writer_.last_completed(); }
  int failures() const { return failures_; }

 private:
  // The message for a failed save of `step`: what failed, and what is left.
  std::string describe(int64_t step, const std::exception& e) const;
  void report(int64_t step, const std::exception& e);

  std::string root_;
  std::string policy_;
  bool lead_ = false;
  CheckpointWriter writer_;
  int64_t in_flight_step_ = -1;  // the step of the save whose outcome is not known yet
  std::string last_error_;       // the newest save's failure, if it failed ("" otherwise)
  int failures_ = 0;
};

}  // namespace trainer
