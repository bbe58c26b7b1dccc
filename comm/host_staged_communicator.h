// A communicator for device tensors that moves them through host memory
// and a host communicator (Gloo): parallel.backend host. NCCL refuses two
// ranks on one GPU, so this is what lets several ranks share a device (a
// lent GPU proves every mesh axis with it), and the fallback when NCCL is
// unusable.
//
// Each call copies its inputs to host buffers in the compute stream's order
// (copy_between_devices: the copy waits for the kernels queued before it,
// and returns once it has landed, a wait on that stream and not the whole
// device), runs the host collective on them, and copies the results back on
// the compute stream. Asynchronous calls copy out at once and copy back in
// wait(). Reductions of BF16 and F16 run in F32, as Gloo reduces no 16-bit
// type: the host copies widen (ops::convert) and the result rounds back
// once. The same code runs on CPU tensors, where the copies are memcpys:
// tests/test_host_staged.cpp runs every mesh axis that way against Gloo.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace trainer {

class HostStagedCommunicator final : public Communicator {
 public:
  // host: a communicator of host tensors over the same members; device: where
  // this communicator's tensors live.
  HostStagedCommunicator(std::unique_ptr<Communicator> host, Device device);
  ~HostStagedCommunicator() override;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::string& name() const override { return host_->name(); }
  const std::vector<int>& members() const override { return host_->members(); }
  Device device() const override { return device_; }
  void abort() override { host_->abort(); }

 protected:
  void do_all_reduce(Tensor t, ReduceOp op) override;
  void do_reduce_scatter(Tensor out, Tensor in) override;
  void do_all_gather(Tensor out, Tensor in) override;
  void do_broadcast(Tensor t, int root) override;
  void do_all_to_all(Tensor out, Tensor in) override;
  void do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                       const std::vector<int64_t>& in_counts) override;
  void do_batch_send_recv(const std::vector<P2POp>& ops) override;
  std::unique_ptr<Work> do_batch_send_recv_posted(const std::vector<P2POp>& ops) override;
  std::unique_ptr<Work> do_batch_send_recv_async(const std::vector<P2POp>& ops) override;
  std::unique_ptr<Work> do_post_receives(const std::vector<P2POp>& receives) override;
  void do_barrier() override { host_->barrier(); }
  std::unique_ptr<Work> do_all_reduce_async(Tensor t) override;
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor out, Tensor in) override;
  std::unique_ptr<Work> do_all_gather_async(Tensor out, Tensor in) override;


 public:
  struct HostCopy;
  struct Pending;

 private:
  // Wraps an asynchronous call's host work; results copied back at its end.
  std::unique_ptr<Work> track(std::unique_ptr<Work> inner, std::vector<HostCopy> inputs, std::vector<HostCopy> results,
                              bool collective = true);
  // Finishes the pending calls whose results land in t's memory, before a
  // later call reads or writes it.
  void settle(const Tensor& t);

  std::unique_ptr<Communicator> host_;
  Device device_;
  std::vector<std::shared_ptr<Pending>> pending_;
};

}  // namespace trainer
