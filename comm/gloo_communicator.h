// The CPU backend: every collective of comm/communicator.h on host tensors,
// over Gloo's TCP transport. It exists so that every parallel layout runs and
// is tested as a set of CPU processes exactly as it runs on GPUs.
//
// A communicator is a Gloo context whose members found each other through the
// rendezvous store (keys under gloo/<group name>/<generation>) and hold one
// TCP connection to every other member. Collectives run on the calling
// thread; the async ones on a worker thread of the communicator, in order
// with the synchronous ones (a synchronous call first waits for the queue).
// reduce_scatter, all_gather and all_reduce (of 1024 elements per rank or
// more) are rings of this file on Gloo's point-to-point buffers: measured
// on a shaped link, gloo::allgather took 1.7x the link's time and
// gloo::allreduce paid stalls of a few ms per call that the rings do not
// (docs/PLANNING.md "Calibrating before planning a real cluster").
//
// Failures: each collective has the communicator's timeout (Gloo's context
// timeout). A rank whose collective fails writes a note under the group's
// store prefix, closes the communicator's connections (so that members still
// waiting in it fail now rather than at their own timeout) and looks, for a
// grace period of timeout/2 clamped to 0.5..3 s, for the other members'
// notes; whoever left none is named as missing:
//   "all_reduce on group dp[tp0] (ranks 0,2,4,6) timed out after 30 s:
//    rank 6 never joined it (0,2,4 did) [gloo: ...]"
// A failed communicator is unusable: its connections may hold half a message.
// A peer that died shows up as a closed connection (make_gloo_device ignores
// SIGPIPE, which would otherwise kill this rank without a word).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"

namespace gloo::transport {
class Device;
}

namespace trainer {

// The address other ranks use to reach this process's Gloo connections:
// GLOO_SOCKET_IFNAME's address when set (make_gloo_device binds that
// interface); 127.0.0.1 when all ranks share this host or the master address
// is spelled as a loopback one; else the address of the interface that routes
// to the master (the network the job's ranks share), or, when that route is
// loopback (this is the master's node), the first interface that is up.
std::string gloo_local_address(const std::string& master_addr, bool single_host);

// The TCP device that all Gloo communicators of a process share (one
// event-loop thread for all their connections).
std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& master_addr, bool single_host);

struct GlooGroup {
  std::string name;          // "dp[tp0]", "world": in every message and store key
  std::vector<int> members;  // global ranks, in group-rank order
  int global_rank = 0;       // this process; must be one of members
  double timeout_s = 600;    // per collective, and for connecting
  int generation = 0;        // tells apart communicators of the same name
};

class GlooCommunicator final : public Communicator {
 public:
  // Collective over the members: returns once this rank is connected to all
  // of them. `store` must outlive the communicator (failure diagnosis uses
  // it). Throws CollectiveTimeout naming the members that did not come within
  // the timeout.
  GlooCommunicator(Store& store, std::shared_ptr<gloo::transport::Device> device, GlooGroup group);
  ~GlooCommunicator() override;
  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;
  const std::vector<int>& members() const override;
  Device device() const override { return Device::CPU; }

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

 public:
  // A posted message of batch_send_recv_posted and the wait for it, which
  // names the peer on failure (gloo_communicator.cpp).
  struct PostedMessage;
  void wait_message(PostedMessage& p);
  // Posts every message of a batch (receives first, after the queue of
  // asynchronous collectives drained); the posted receives go to `recvs`,
  // the sends into the returned Work.
  std::unique_ptr<Work> post_batch(const std::vector<P2POp>& ops, std::vector<PostedMessage>& recvs);

 protected:
  void do_barrier() override;

  std::unique_ptr<Work> do_all_reduce_async(Tensor t) override;
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor out, Tensor in) override;
  std::unique_ptr<Work> do_all_gather_async(Tensor out, Tensor in) override;
 public:

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainer
