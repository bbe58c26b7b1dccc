// Every communicator a rank needs, made once at start-up from the launch
// (who am I, where is rank 0) and the mesh (which groups exist):
//
//   ProcessGroups pg(launch, mesh, device, {cfg.parallel.timeout_s});
//   pg.group(Axis::DP).all_reduce(grads);
//   ...
//   pg.finalize();   // before a clean exit (rank 0 serves the store)
//
// Rank 0 serves the rendezvous store at MASTER_ADDR:MASTER_PORT; every rank
// connects to it, meets the others at the barrier "init" (a timeout names
// the ranks that never came), then builds the world communicator and one
// communicator per axis of comm/mesh.h: Gloo for CPU tensors, NCCL for CUDA
// tensors. An axis of size 1 gets a SingleRankCommunicator, so callers need
// no special case for "not parallel along this axis".
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"
#include "comm/store.h"
#include "comm/launch.h"

namespace gloo::transport {
class Device;
}

namespace trainer {

// The group of one rank: collectives are copies or nothing. Serves CPU and
// CUDA tensors alike (copies go through ops::copy, so on the compute stream).
class SingleRankCommunicator final : public Communicator {
 public:
  SingleRankCommunicator(std::string name, int global_rank, Device device)
      : name_(std::move(name)), members_{global_rank}, device_(device) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& members() const override { return members_; }
  Device device() const override { return device_; }

 protected:
  void do_all_reduce(Tensor, ReduceOp) override {}
  void do_reduce_scatter(Tensor out, Tensor in) override;
  void do_all_gather(Tensor out, Tensor in) override;
  void do_broadcast(Tensor t, int root) override;
  void do_all_to_all(Tensor out, Tensor in) override;
  void do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                       const std::vector<int64_t>& in_counts) override;
  void do_batch_send_recv(const std::vector<P2POp>& ops) override;
  void do_barrier() override {}

  std::unique_ptr<Work> do_all_reduce_async(Tensor t) override;
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor out, Tensor in) override;
  std::unique_ptr<Work> do_all_gather_async(Tensor out, Tensor in) override;
 public:

 private:
  [[noreturn]] void bad(const char* op, const std::string& why) const;
  std::string name_;
  std::vector<int> members_;
  Device device_;
};

struct ProcessGroupOptions {
  // parallel.timeout_s: connecting to the store, every store wait, creating
  // communicators and every collective.
  double timeout_s = 600;
  // "" : job_token_from_env() (comm/store.h).
  std::string token;
  // The store's secret; unset: store_secret_from_env() (TRAINER_STORE_SECRET,
  // comm/store_secret.h), "" for none.
  std::optional<std::string> secret;
  // CUDA runs: also a Gloo communicator over all ranks, for host tensors
  // (metadata, checkpoint bookkeeping). CPU runs: host_world() is world().
  bool host_world = false;
  // Device tensors' collectives through host memory and Gloo
  // (comm/host_staged_communicator.h) instead of NCCL; on the CPU the same
  // staging over CPU tensors (parallel.backend host).
  bool host_staged = false;
};

class ProcessGroups {
 public:
  // Collective over the whole job. `device` picks the backend. Throws
  // StoreError / CollectiveTimeout naming what is missing, or
  // std::invalid_argument when the mesh does not match the launch.
  ProcessGroups(const LaunchInfo& launch, const MeshShape& mesh, Device device, ProcessGroupOptions options = {});
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return mesh_.world(); }
  const MeshShape& mesh() const { return mesh_; }
  Device device() const { return device_; }

  Communicator& world() { return *world_; }
  Communicator& group(Axis a) { return *groups_[size_t(a)]; }
  // Host tensors over all ranks (see ProcessGroupOptions::host_world).
  Communicator& host_world();
  StoreClient& store() { return *store_; }

  // Waits until every rank got here: rank 0's store must outlive the others'
  // last use of it, so a rank that finished first must not tear it down.
  void finalize();

  // A communicator over `members` (global ranks, ascending; at least one)
  // made by the same factory as the axes' groups: Gloo (or host-staged Gloo)
  // for the run's device, an NCCL split of the world on CUDA. Collective
  // over the whole world, every rank naming the same members and a `name`
  // no other group of the job has ("calib_across"); nullptr on the ranks
  // that are not members.
  std::unique_ptr<Communicator> subgroup(const std::string& name, const std::vector<int>& members);

 private:
  void connect_all(const LaunchInfo& launch, int generation);

  int rank_ = 0;
  MeshShape mesh_;
  Device device_;
  ProcessGroupOptions options_;
  int generation_ = 0;  // of this ProcessGroups (process_group.cpp g_generation)
  bool single_host_ = false;
  std::string master_addr_;
  // Declaration order is destruction order reversed: communicators go first,
  // then the Gloo device, the store client, and last the server.
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> store_;
  std::shared_ptr<gloo::transport::Device> gloo_device_;
  std::unique_ptr<Communicator> world_;
  std::array<std::unique_ptr<Communicator>, std::size(kAllAxes)> groups_;
  std::unique_ptr<Communicator> host_world_;
};

}  // namespace trainer
