// The GPU backend: every collective of comm/communicator.h on CUDA tensors,
// with NCCL. Part of the CUDA module, and only when NCCL was found
// (TRAINER_HAVE_NCCL); the trainer reaches it through the module's NCCL
// table (comm/nccl_table.h: nccl_world, nccl_split), from comm/process_group.cpp.
//
// The world communicator comes from one NCCL unique id that rank 0 creates
// and publishes in the rendezvous store (key nccl/world/<generation>); every
// other communicator is split from it with ncclCommSplit (color = group,
// key = position in the group; comm/mesh.h group_split), which every rank of
// the world calls for every split, in the same order.
//
// Streams: synchronous collectives are queued on the compute stream
// (kernels/cuda/compute_stream.h), in order with the kernels around them; the
// host does not wait. Async ones run on the communicator's own stream after
// the compute stream's queued work, and Work::wait makes the compute stream
// wait for them. A synchronous collective issued after async ones of the
// same communicator waits for them on the device, so one communicator's
// collectives reach NCCL in the order issued on every rank.
//
// Hangs: NCCL calls return once queued, so a peer that never comes shows up
// as a kernel that never ends, not as an error here. Every communicator is
// blocking-mode and created after the store's "init" barrier, so creation
// only hangs if a rank dies in between. Beyond that the watchdog (heartbeats
// in the store, parallel.timeout_s) calls abort(), i.e. ncclCommAbort, which
// ends the stuck kernels, and exits with a message naming the group; NCCL's
// own asynchronous errors are read with ncclCommGetAsyncError there too
// (async_error below).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"

namespace trainer {

// "NCCL 2.27.7" (ncclGetVersion), for the module's description.
std::string nccl_version();

class NcclCommunicator final : public Communicator {
 public:
  // Every rank of the job calls it, after cudaSetDevice. Rank 0 publishes
  // the unique id; the others wait for it up to timeout_s (a timeout says
  // rank 0 never published it).
  static std::unique_ptr<NcclCommunicator> create_world(Store& store, int rank, int world, double timeout_s,
                                                        int generation = 0);

  // Collective over this communicator: every member calls it with its own
  // color and key. `members` are the global ranks of the new group in key
  // order (checked against what NCCL made), `name` is for messages.
  std::unique_ptr<NcclCommunicator> split(int color, int key, std::string name, std::vector<int> members);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  const std::vector<int>& members() const override;
  Device device() const override { return Device::CUDA; }

 protected:
  void do_all_reduce(Tensor t, ReduceOp op) override;
  void do_reduce_scatter(Tensor out, Tensor in) override;
  void do_all_gather(Tensor out, Tensor in) override;
  void do_broadcast(Tensor t, int root) override;
  void do_all_to_all(Tensor out, Tensor in) override;
  void do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                       const std::vector<int64_t>& in_counts) override;
  void do_batch_send_recv(const std::vector<P2POp>& ops) override;
  // Blocks the host until every member got here (and the compute stream's
  // queued work is done).
  void do_barrier() override;

  std::unique_ptr<Work> do_all_reduce_async(Tensor t) override;
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor out, Tensor in) override;
  std::unique_ptr<Work> do_all_gather_async(Tensor out, Tensor in) override;
 public:

  void abort() override;
  // For the watchdog: "" while healthy, else NCCL's description of the
  // asynchronous error (a peer failed, a network error).
  std::string async_error();

  struct Impl;

 private:
  explicit NcclCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer
