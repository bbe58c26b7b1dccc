// The collective interface every parallel feature uses. Two backends: NCCL
// for CUDA tensors (comm/nccl_communicator.*) and Gloo over TCP for host
// tensors (comm/gloo_communicator.*), so every layout runs and is tested on
// CPU processes exactly as on GPUs.
//
// All ranks of a group call the same collectives in the same order. Tensors
// are contiguous F32/BF16/F16/I32 views; reductions are sums unless stated.
// Gloo reduces F32, F64 and I32 only (the CPU path is fp32); moves
// (gather, broadcast, all-to-all, send/recv) take any dtype on both backends.
// The calls below check their arguments once (comm/collective_checks.h)
// and hand them to the backend's hooks, as the op router does for ops.
// A collective that does not complete within the communicator's timeout
// throws CollectiveTimeout naming the collective, the group and the ranks
// that did not arrive (the watchdog turns that into a clean exit).
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/collective_checks.h"
#include "core/tensor.h"

namespace trainer {

enum class ReduceOp { Sum, Max };

struct CollectiveTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How long a member whose collective failed waits for the others' failure
// notes before naming the missing ranks; the watchdog's own grace and rank
// 0's linger are built on it, so that this explanation arrives first.
inline double collective_failure_grace_s(double timeout_s) {
  return std::clamp(timeout_s / 2, 0.5, 3.0);
}

// A pending asynchronous collective; wait() rethrows its error.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  // After wait(): how long the communication itself ran on the backend's
  // own thread, whether or not anyone waited for it (the busy time that
  // overlap hides); < 0 when the backend does not know (then the wait is
  // all that is known of it).
  virtual double busy_seconds() const { return -1; }
  // After wait(): when that run started and ended (core/trace.h's clock,
  // nanoseconds); {0, 0} when the backend does not know.
  virtual std::pair<int64_t, int64_t> ran_ns() const { return {0, 0}; }
};

// Work that was complete when it was returned.
class CompletedWork final : public Work {
 public:
  void wait() override {}
  double busy_seconds() const override { return 0; }
};

struct P2POp {
  bool send = true;  // false: receive
  Tensor tensor;
  int peer = 0;      // rank within the group
};

// "0,2,4,6"; long lists keep their ends ("0,8,16,...,8176,8184 (1024 ranks)")
// so that an error about a big group stays one readable line.
inline std::string format_rank_list(const std::vector<int>& ranks) {
  constexpr size_t kHead = 8, kTail = 2;
  std::string s;
  auto put = [&](int r) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  };
  if (ranks.size() <= kHead + kTail + 1) {
    for (int r : ranks) put(r);
    return s;
  }
  for (size_t i = 0; i < kHead; ++i) put(ranks[i]);
  s += ",...";
  for (size_t i = ranks.size() - kTail; i < ranks.size(); ++i) put(ranks[i]);
  return s + " (" + std::to_string(ranks.size()) + " ranks)";
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "dp[pp0,tp1]": used in every error message.
  virtual const std::string& name() const = 0;
  // Global ranks of the members, in group-rank order (for messages).
  virtual const std::vector<int>& members() const = 0;
  // Where the tensors of this communicator live: CPU (Gloo) or CUDA (NCCL).
  // A size-1 communicator serves either.
  virtual Device device() const = 0;
  // "dp[tp0] (ranks 0,2,4,6)": how every error names the group.
  std::string describe() const { return name() + " (ranks " + format_rank_list(members()) + ")"; }

  void all_reduce(Tensor t, ReduceOp op = ReduceOp::Sum) {  // in place
    check_all_reduce(*this, t);
    do_all_reduce(t, op);
  }
  // out.numel() * size() == in.numel(); rank r receives the sum of chunk r.
  // out may be this rank's own chunk of in; otherwise in is left as it was.
  void reduce_scatter(Tensor out, Tensor in) {
    check_reduce_scatter(*this, out, in);
    do_reduce_scatter(out, in);
  }
  // out.numel() == size() * in.numel(); chunk r of out is rank r's in.
  // `in` may be this rank's own chunk of out (in-place gather).
  void all_gather(Tensor out, Tensor in) {
    check_all_gather(*this, out, in);
    do_all_gather(out, in);
  }
  void broadcast(Tensor t, int root) {
    check_broadcast(*this, t, root);
    do_broadcast(t, root);
  }
  // Equal chunks: chunk r of in goes to rank r; chunk r of out came from rank r.
  // in and out must not overlap (NCCL refuses; Gloo copes).
  void all_to_all(Tensor out, Tensor in) {
    check_all_to_all(*this, out, in);
    do_all_to_all(out, in);
  }
  // Element counts per peer (in group-rank order), chunks laid out in order;
  // elements past the counts are left alone. in and out must not overlap.
  void all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                    const std::vector<int64_t>& in_counts) {
    check_all_to_all_v(*this, out, out_counts, in, in_counts);
    do_all_to_all_v(out, out_counts, in, in_counts);
  }
  // All sends and receives of one batch are issued together (pipeline
  // neighbours exchange both ways without deadlock). Messages between two
  // ranks pair up in order: A's k-th send to B is B's k-th receive from A,
  // with the same byte count. Not collective: other members need not call.
  void batch_send_recv(const std::vector<P2POp>& ops) {
    check_send_recv(*this, ops);
    do_batch_send_recv(ops);
  }
  // As batch_send_recv, but returns once the receives have arrived: the
  // sends may still be on their way (their receiver has not asked for them
  // yet), and their tensors must stay untouched until the returned Work's
  // wait(), which blocks until they are delivered. A pipeline rank thereby
  // goes on computing while its neighbour is busy. Gloo: the transport
  // delivers posted sends in the background. The default (NCCL, a group of
  // one) runs batch_send_recv, so nothing is left to wait for; on NCCL the
  // whole batch is one group on the compute stream, whose later kernels
  // queue behind it.
  std::unique_ptr<Work> batch_send_recv_posted(const std::vector<P2POp>& ops) {
    check_send_recv(*this, ops);
    return do_batch_send_recv_posted(ops);
  }
  // As batch_send_recv, but returns at once: the receive tensors are filled
  // and the send tensors may be reused only after wait(). The context-
  // parallel ring passes the next key/value block this way while it
  // computes on the current one. Gloo posts every message and its
  // transport moves them in the background; the default runs
  // batch_send_recv.
  std::unique_ptr<Work> batch_send_recv_async(const std::vector<P2POp>& ops) {
    check_send_recv(*this, ops);
    return do_batch_send_recv_async(ops);
  }
  // Posts receives now, to be waited for when their tensors are needed:
  // the senders' data moves while this rank computes (the pipeline posts
  // the next batch's receives as soon as the current batch is done). The
  // tensors must stay untouched until wait(). Receives from a peer pair up
  // with its sends in the order posted, with those of later batches.
  // nullptr where the backend cannot post a receive on its own without
  // blocking (NCCL: a receive runs in a group with its batch's sends, on
  // the compute stream); the caller then receives them in its batch.
  std::unique_ptr<Work> post_receives(const std::vector<P2POp>& receives) {
    check_send_recv(*this, receives);
    for (const P2POp& op : receives)
      if (op.send) throw std::invalid_argument("post_receives on group " + describe() + ": given a send to rank " +
                                               std::to_string(op.peer) + " (receives only)");
    return do_post_receives(receives);
  }
  void barrier() { do_barrier(); }

  // Asynchronous all-reduce / reduce-scatter for overlapping gradient
  // communication with backward, and all-gather for prefetching ZeRO-3
  // parameter shards ahead of their use; the tensors must stay untouched
  // until wait(). Collectives of one communicator, async or not, run in the
  // order issued (so a gather may read what an earlier async call wrote).
  // NCCL: the collective runs on a communication stream once the work already
  // queued on the compute stream is done; wait() makes the compute stream
  // wait for it (the host does not block). Gloo: it runs on the
  // communicator's worker thread; wait() blocks the host until it is done.
  std::unique_ptr<Work> all_reduce_async(Tensor t) {
    check_all_reduce(*this, t);
    return do_all_reduce_async(t);
  }
  std::unique_ptr<Work> reduce_scatter_async(Tensor out, Tensor in) {
    check_reduce_scatter(*this, out, in);
    return do_reduce_scatter_async(out, in);
  }
  // As all_gather: out.numel() == size() * in.numel(), any dtype, and `in`
  // may be this rank's own chunk of out (in-place gather).
  std::unique_ptr<Work> all_gather_async(Tensor out, Tensor in) {
    check_all_gather(*this, out, in);
    return do_all_gather_async(out, in);
  }


  // For the watchdog, from any thread: makes the pending and all later
  // collectives fail instead of hanging (NCCL: ncclCommAbort). The
  // communicator is unusable afterwards. Gloo needs nothing here: its
  // collectives end by themselves at the timeout.
  virtual void abort() {}

 protected:
  // The backend hooks, called with arguments the shared checks passed
  // (comm/collective_checks.h); each backend checks only what is its own.
  virtual void do_all_reduce(Tensor t, ReduceOp op) = 0;
  virtual void do_reduce_scatter(Tensor out, Tensor in) = 0;
  virtual void do_all_gather(Tensor out, Tensor in) = 0;
  virtual void do_broadcast(Tensor t, int root) = 0;
  virtual void do_all_to_all(Tensor out, Tensor in) = 0;
  virtual void do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                               const std::vector<int64_t>& in_counts) = 0;
  virtual void do_batch_send_recv(const std::vector<P2POp>& ops) = 0;
  // Default: do_batch_send_recv, then nothing left to wait for.
  virtual std::unique_ptr<Work> do_batch_send_recv_posted(const std::vector<P2POp>& ops) {
    do_batch_send_recv(ops);
    return std::make_unique<CompletedWork>();
  }
  virtual std::unique_ptr<Work> do_batch_send_recv_async(const std::vector<P2POp>& ops) {
    do_batch_send_recv(ops);
    return std::make_unique<CompletedWork>();
  }
  virtual std::unique_ptr<Work> do_post_receives(const std::vector<P2POp>&) { return nullptr; }
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<Work> do_all_reduce_async(Tensor t) = 0;
  virtual std::unique_ptr<Work> do_reduce_scatter_async(Tensor out, Tensor in) = 0;
  virtual std::unique_ptr<Work> do_all_gather_async(Tensor out, Tensor in) = 0;
};

}  // namespace trainer
