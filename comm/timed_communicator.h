// A communicator that counts the time its caller spends blocked in it: in
// every synchronous collective, and in the wait() of every asynchronous one
// (docs/ARCHITECTURE.md "Where the time went"). The engine wraps each of its
// groups so that a step's exposed communication is known per group; a
// process-wide total lets the pipeline executor take communication out of
// its compute times. On NCCL only host-side blocking is seen (the device
// waits on streams), so there it measures what the host waits for.
//
// It also counts the payload bytes of every call by collective kind, so a
// run can report what each group moved per step and a test can hold the
// plan's prediction (planner/comm_plan.h) to it. Payload is the tensor a
// collective is about, as model/tp_traffic.h defines it: an all-reduce's
// tensor, an all-gather's output, a reduce-scatter's input, an all-to-all's
// input (all of it, the own chunk included), a broadcast's tensor; sends and
// receives count their own tensors.
//
// And it keeps the time of each synchronous collective and of each wait()
// of an asynchronous one (not of sends and receives) until take_waits():
// every member of a group makes the same calls and waits in the same order,
// so the k-th entry of each member is the same call, and the member that
// waited least arrived last (observe/wait_attribution.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace trainer {

// Seconds every TimedCommunicator of this process has blocked its callers.
double total_blocked_seconds();

enum class CommKind { AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, Send, Recv };
inline constexpr int kCommKinds = 7;
// "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv"
const char* comm_kind_name(CommKind k);

// Payload bytes and calls per collective kind.
struct CommBytes {
  std::array<int64_t, kCommKinds> bytes{}, calls{};
  int64_t of(CommKind k) const { return bytes[size_t(k)]; }
  void add(CommKind k, int64_t b) {
    bytes[size_t(k)] += b;
    calls[size_t(k)] += 1;
  }
  CommBytes operator-(const CommBytes& o) const;
};

class TimedCommunicator final : public Communicator {
 public:
  // `label`: how the time breakdown names the group ("tp", "dp_cp", ...).
  TimedCommunicator(Communicator& inner, std::string label) : inner_(inner), label_(std::move(label)) {}
  const std::string& label() const { return label_; }
  double blocked_seconds() const { return blocked_s_; }
  // Seconds the group's communication ran: a synchronous call's time, and an
  // asynchronous one's run on the backend's thread (Work::busy_seconds; its
  // wait where the backend cannot tell). busy - blocked is what overlap hid.
  double busy_seconds() const { return busy_s_; }
  void add_busy(double seconds) { busy_s_ += seconds; }
  const CommBytes& bytes() const { return bytes_; }
  Communicator& inner() { return inner_; }
  // The seconds of each collective (or wait) since the last call (at most
  // kMaxWaits: beyond that every member stops recording at the same call).
  static constexpr size_t kMaxWaits = size_t(1) << 18;
  std::vector<float> take_waits() { return std::exchange(waits_, {}); }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  const std::vector<int>& members() const override { return inner_.members(); }
  Device device() const override { return inner_.device(); }
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
  void do_barrier() override;
  std::unique_ptr<Work> do_all_reduce_async(Tensor t) override;
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor out, Tensor in) override;
  std::unique_ptr<Work> do_all_gather_async(Tensor out, Tensor in) override;
 public:
  void abort() override { inner_.abort(); }

  void add(double seconds);
  // add() for a synchronous collective: also kept in waits_.
  void add_collective(double seconds);

 private:
  Communicator& inner_;
  std::string label_;
  double blocked_s_ = 0, busy_s_ = 0;
  std::vector<float> waits_;
  CommBytes bytes_;
  void count_p2p(const std::vector<P2POp>& ops);
};

}  // namespace trainer
