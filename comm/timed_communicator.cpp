#include "comm/timed_communicator.h"

#include <atomic>
#include <chrono>

namespace trainer {

namespace {

std::atomic<int64_t> g_blocked_ns{0};

using clock_type = std::chrono::steady_clock;

// Times one call on the calling thread; `collective`: a collective (or its
// wait), whose time is also kept per call; `busy`: the call is the
// communication itself (synchronous), so its time is busy time too.
template <typename F>
auto timed(TimedCommunicator& c, F&& f, bool collective = false, bool busy = false) {
  const auto t0 = clock_type::now();
  struct Done {
    TimedCommunicator& c;
    clock_type::time_point t0;
    bool collective, busy;
    ~Done() {
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      if (collective)
        c.add_collective(s);
      else
        c.add(s);
      if (busy) c.add_busy(s);
    }
  } done{c, t0, collective, busy};
  return f();
}

class TimedWork final : public Work {
 public:
  // p2p: sends and receives, whose waits pair different ranks per call.
  TimedWork(TimedCommunicator& c, std::unique_ptr<Work> w, bool p2p = false) : c_(c), w_(std::move(w)), p2p_(p2p) {}
  void wait() override {
    const double blocked0 = c_.blocked_seconds();
    timed(c_, [&] { w_->wait(); }, !p2p_);
    const double busy = w_->busy_seconds();
    c_.add_busy(busy >= 0 ? busy : c_.blocked_seconds() - blocked0);
  }
  double busy_seconds() const override { return w_->busy_seconds(); }

 private:
  TimedCommunicator& c_;
  std::unique_ptr<Work> w_;
  bool p2p_ = false;
};

}  // namespace

double total_blocked_seconds() { return double(g_blocked_ns.load()) * 1e-9; }

const char* comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::AllReduce: return "all_reduce";
    case CommKind::AllGather: return "all_gather";
    case CommKind::ReduceScatter: return "reduce_scatter";
    case CommKind::AllToAll: return "all_to_all";
    case CommKind::Broadcast: return "broadcast";
    case CommKind::Send: return "send";
    case CommKind::Recv: return "recv";
  }
  return "?";
}

CommBytes CommBytes::operator-(const CommBytes& o) const {
  CommBytes d;
  for (size_t i = 0; i < bytes.size(); ++i) {
    d.bytes[i] = bytes[i] - o.bytes[i];
    d.calls[i] = calls[i] - o.calls[i];
  }
  return d;
}

void TimedCommunicator::count_p2p(const std::vector<P2POp>& ops) {
  for (const P2POp& op : ops) bytes_.add(op.send ? CommKind::Send : CommKind::Recv, int64_t(op.tensor.nbytes()));
}

void TimedCommunicator::add(double seconds) {
  blocked_s_ += seconds;
  g_blocked_ns.fetch_add(int64_t(seconds * 1e9));
}

void TimedCommunicator::add_collective(double seconds) {
  add(seconds);
  if (waits_.size() < kMaxWaits) waits_.push_back(float(seconds));
}

void TimedCommunicator::do_all_reduce(Tensor t, ReduceOp op) {
  bytes_.add(CommKind::AllReduce, int64_t(t.nbytes()));
  timed(*this, [&] { inner_.all_reduce(t, op); }, true, true);
}
void TimedCommunicator::do_reduce_scatter(Tensor out, Tensor in) {
  bytes_.add(CommKind::ReduceScatter, int64_t(in.nbytes()));
  timed(*this, [&] { inner_.reduce_scatter(out, in); }, true, true);
}
void TimedCommunicator::do_all_gather(Tensor out, Tensor in) {
  bytes_.add(CommKind::AllGather, int64_t(out.nbytes()));
  timed(*this, [&] { inner_.all_gather(out, in); }, true, true);
}
void TimedCommunicator::do_broadcast(Tensor t, int root) {
  bytes_.add(CommKind::Broadcast, int64_t(t.nbytes()));
  timed(*this, [&] { inner_.broadcast(t, root); }, true, true);
}
void TimedCommunicator::do_all_to_all(Tensor out, Tensor in) {
  bytes_.add(CommKind::AllToAll, int64_t(in.nbytes()));
  timed(*this, [&] { inner_.all_to_all(out, in); }, true, true);
}
void TimedCommunicator::do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                                     const std::vector<int64_t>& in_counts) {
  int64_t elems = 0;
  for (int64_t n : in_counts) elems += n;
  bytes_.add(CommKind::AllToAll, elems * int64_t(dtype_size(in.dtype)));
  timed(*this, [&] { inner_.all_to_all_v(out, out_counts, in, in_counts); }, true, true);
}
void TimedCommunicator::do_batch_send_recv(const std::vector<P2POp>& ops) {
  count_p2p(ops);
  timed(*this, [&] { inner_.batch_send_recv(ops); }, false, true);
}
std::unique_ptr<Work> TimedCommunicator::do_batch_send_recv_posted(const std::vector<P2POp>& ops) {
  count_p2p(ops);
  return std::make_unique<TimedWork>(*this, timed(*this, [&] { return inner_.batch_send_recv_posted(ops); }), true);
}
std::unique_ptr<Work> TimedCommunicator::do_batch_send_recv_async(const std::vector<P2POp>& ops) {
  count_p2p(ops);
  return std::make_unique<TimedWork>(*this, timed(*this, [&] { return inner_.batch_send_recv_async(ops); }), true);
}
std::unique_ptr<Work> TimedCommunicator::do_post_receives(const std::vector<P2POp>& receives) {
  std::unique_ptr<Work> w = timed(*this, [&] { return inner_.post_receives(receives); });
  if (!w) return nullptr;
  count_p2p(receives);
  return std::make_unique<TimedWork>(*this, std::move(w), true);
}
void TimedCommunicator::do_barrier() {
  timed(*this, [&] { inner_.barrier(); }, true, true);
}
std::unique_ptr<Work> TimedCommunicator::do_all_reduce_async(Tensor t) {
  bytes_.add(CommKind::AllReduce, int64_t(t.nbytes()));
  return std::make_unique<TimedWork>(*this, timed(*this, [&] { return inner_.all_reduce_async(t); }));
}
std::unique_ptr<Work> TimedCommunicator::do_reduce_scatter_async(Tensor out, Tensor in) {
  bytes_.add(CommKind::ReduceScatter, int64_t(in.nbytes()));
  return std::make_unique<TimedWork>(*this, timed(*this, [&] { return inner_.reduce_scatter_async(out, in); }));
}
std::unique_ptr<Work> TimedCommunicator::do_all_gather_async(Tensor out, Tensor in) {
  bytes_.add(CommKind::AllGather, int64_t(out.nbytes()));
  return std::make_unique<TimedWork>(*this, timed(*this, [&] { return inner_.all_gather_async(out, in); }));
}

}  // namespace trainer
