#include "train/checkpoint_saver.h"

#include <fstream>
#include <iostream>
#include <stdexcept>

namespace trainer {

CheckpointSaver::CheckpointSaver(std::string root, int keep_last, bool async, CheckpointGroup group,
                                 std::string policy, bool lead)
    : root_(root), policy_(std::move(policy)), lead_(lead), writer_(std::move(root), keep_last, async, group) {
  if (policy_ != "stop" && policy_ != "continue")
    throw std::invalid_argument("checkpoint.on_save_error must be stop or continue, got \"" + policy_ + "\"");
}

std::string CheckpointSaver::describe(int64_t step, const std::exception& e) const {
  std::string latest = "(none)";
  if (std::ifstream in(root_ + "/latest"); in) std::getline(in, latest);
  return "checkpoint save of step " + std::to_string(step) + " under " + root_ + " failed: " + e.what() +
         "; `latest` still names " + latest + " and the older checkpoints are untouched";
}

void CheckpointSaver::report(int64_t step, const std::exception& e) {
  ++failures_;
  last_error_ = describe(step, e);
  if (policy_ == "stop") throw std::runtime_error(last_error_ + " (checkpoint.on_save_error=stop)");
  if (lead_)
    std::cerr << "\n!!! checkpoint: ERROR: " << last_error_
              << "\n!!! checkpoint.on_save_error=continue: training goes on, the next save tries again (" << failures_
              << " failed save" << (failures_ == 1 ? "" : "s") << " so far)\n\n";
}

void CheckpointSaver::settle() {
  try {
    writer_.wait();
  } catch (const std::exception& e) {
    report(in_flight_step_, e);
  }
}

bool CheckpointSaver::save(Snapshot snap) {
  const int64_t step = snap.meta.step;
  // The previous background save's outcome first, so a failure is reported
  // under its own step.
  settle();
  in_flight_step_ = step;
  last_error_.clear();
  try {
    writer_.save(std::move(snap));  // synchronous: the whole write; asynchronous: the start
  } catch (const std::exception& e) {
    in_flight_step_ = -1;
    report(step, e);
    return false;
  }
  return true;
}

void CheckpointSaver::wait() {
  try {
    writer_.wait();
  } catch (const std::exception& e) {
    // Nothing else will hold the final state: fatal under either policy.
    throw std::runtime_error(describe(in_flight_step_, e) + " (the run's last save must succeed)");
  }
  // A synchronous last save that failed under continue was only reported.
  if (!last_error_.empty()) throw std::runtime_error(last_error_ + " (the run's last save must succeed)");
}

}  // namespace trainer
