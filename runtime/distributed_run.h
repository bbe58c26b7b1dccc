// The processes of one training job as the engine sees them: the process
// groups and watchdog of a launched job, this rank's place in data
// parallelism, and the two communicators ZeRO uses. One process without a
// launcher gets single-rank communicators and no store, so the engine has no
// separate one-process path.
#pragma once

#include <memory>

#include "comm/process_group.h"
#include "config/config.h"
#include "comm/launch.h"
#include "runtime/watchdog.h"

namespace trainer {

class DistributedRun {
 public:
  // Builds the groups when a launcher started this process (even a single
  // one: on a GPU it then gets an NCCL communicator of one), and the
  // watchdog when there are several ranks. Throws ConfigError for layouts
  // the engine does not train yet (tp/pp/cp/ep > 1).
  DistributedRun(const Config& cfg, const LaunchInfo& launch, Device device);

  int dp() const { return dp_; }
  int dp_rank() const { return dp_rank_; }
  bool launched() const { return groups_ != nullptr; }
  // Gradients and weights (NCCL on a GPU, Gloo on the CPU).
  Communicator& dp_group() { return *dp_group_; }
  // Host tensors (loss sums, norms, agreement flags) over the same ranks.
  Communicator& dp_host() { return *dp_host_; }
  Store* store() { return groups_ ? &groups_->store() : nullptr; }
  Watchdog* watchdog() { return watchdog_.get(); }
  // Stops the watchdog and waits for every rank (rank 0 serves the store).
  void finish();

 private:
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<SingleRankCommunicator> solo_;
  Communicator* dp_group_ = nullptr;
  Communicator* dp_host_ = nullptr;
  int dp_ = 1, dp_rank_ = 0;
};

}  // namespace trainer
