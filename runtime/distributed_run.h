// The processes of one training job as the engine sees them: the process
// groups and watchdog of a launched job, the mesh and this rank's place in
// it, and the communicators the model (tensor parallel) and ZeRO (data
// parallel, host sums) use. One process without a launcher gets
// single-rank communicators and no store, so the engine has no separate
// one-process path.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "comm/timed_communicator.h"
#include "config/config.h"
#include "comm/launch.h"
#include "runtime/watchdog.h"

namespace trainer {

class DistributedRun {
 public:
  // Builds the groups when a launcher started this process (even a single
  // one: on a GPU it then gets an NCCL communicator of one), and the
  // watchdog when there are several ranks.
  DistributedRun(const Config& cfg, const LaunchInfo& launch, Device device);

  const MeshShape& mesh() const { return mesh_; }
  // "comm: ..." (runtime/comm_backend.h) under a launcher with several
  // ranks, else "".
  const std::string& backend_line() const { return backend_line_; }
  const Coords& coords() const { return at_; }
  int dp() const { return mesh_.dp; }
  int dp_rank() const { return at_.dp; }
  bool launched() const { return groups_ != nullptr; }
  // Gradients and weights (NCCL on a GPU, Gloo on the CPU): the
  // data-parallel group of this rank's tensor-parallel position.
  Communicator& dp_group() { return *dp_group_; }
  // The tensor-parallel group (activations and their gradients inside the model).
  Communicator& tp_group() { return *tp_group_; }
  // The pipeline group (rank = stage): activations and gradients between stages.
  Communicator& pp_group() { return *pp_group_; }
  // Expert parallelism: the group that splits the experts (tokens travel
  // to their experts over it) and the group that holds the same experts
  // (their gradients are summed over it).
  Communicator& ep_group() { return *ep_group_; }
  // Context parallelism: the ranks that split each sequence (the attention ring).
  Communicator& cp_group() { return *cp_group_; }
  Communicator& edp_group() { return *edp_group_; }
  // Host tensors over every rank of the job (loss sums, the gradient norm,
  // agreement flags).
  Communicator& host() { return *host_; }
  Store* store() { return groups_ ? &groups_->store() : nullptr; }
  // The process groups of a launched job (nullptr for one process without
  // a launcher): further groups come from the same factory (ProcessGroups::subgroup).
  ProcessGroups* groups() { return groups_.get(); }
  Watchdog* watchdog() { return watchdog_.get(); }
  // Stops the watchdog and waits for every rank (rank 0 serves the store).
  void finish();
  // Every group above counts the time its callers block in it
  // (comm/timed_communicator.h), named tp, dp_cp, pp, ep, edp, cp, host.
  const std::vector<std::unique_ptr<TimedCommunicator>>& timed_groups() const { return timed_; }

 private:
  std::unique_ptr<ProcessGroups> groups_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<SingleRankCommunicator> solo_, solo_tp_, solo_pp_, solo_ep_, solo_cp_;
  Communicator* dp_group_ = nullptr;
  Communicator* tp_group_ = nullptr;
  Communicator* pp_group_ = nullptr;
  Communicator* ep_group_ = nullptr;
  Communicator* cp_group_ = nullptr;
  Communicator* edp_group_ = nullptr;
  Communicator* host_ = nullptr;
  MeshShape mesh_;
  std::string backend_line_;
  Coords at_;
  std::vector<std::unique_ptr<TimedCommunicator>> timed_;
  void wrap_groups();
};

}  // namespace trainer
