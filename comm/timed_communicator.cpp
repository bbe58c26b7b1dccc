#include "comm/timed_communicator.h"

#include <atomic>
#include <chrono>
#include <string>

#include "core/trace.h"

namespace trainer {

namespace {

std::atomic<int64_t> g_blocked_ns{0};

using clock_type = std::chrono::steady_clock;

// What the timeline shows of one call (core/trace.h): its name ("all_reduce",
// "wait all_gather"), the payload bytes, and whether it is the run itself
// (a synchronous call), which then also goes on the group's own track.
struct Traced {
  const char* op = "";
  int64_t bytes = 0;
  bool run = false;
  const char* prefix = "";  // "wait ": the wait of an asynchronous call
};

std::string bytes_arg(int64_t bytes) { return "\"bytes\": " + std::to_string(bytes); }

void trace_call(TimedCommunicator& c, const Traced& t, int64_t t0, int64_t t1) {
  if (!trace::on()) return;
  const std::string name = std::string(t.prefix) + t.op + " " + c.label();
  const std::string args = bytes_arg(t.bytes) + ", \"group\": \"" + c.name() + "\"";
  trace::span("wait", name, t0, t1, args);
  if (t.run) trace::span_on("comm " + c.label(), "comm", name, t0, t1, args);
}

// Times one call on the calling thread; `collective`: a collective (or its
// wait), whose time is also kept per call; `traced.run`: the call is the
// communication itself (synchronous), so its time is busy time too.
template <typename F>
auto timed(TimedCommunicator& c, F&& f, const Traced& traced, bool collective = false) {
  const auto t0 = clock_type::now();
  const int64_t trace0 = trace::on() ? trace::now_ns() : 0;
  struct Done {
    TimedCommunicator& c;
    clock_type::time_point t0;
    int64_t trace0;
    const Traced& traced;
    bool collective;
    ~Done() {
      const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
      if (collective)
        c.add_collective(s);
      else
        c.add(s);
      if (traced.run) c.add_busy(s);
      if (trace0) trace_call(c, traced, trace0, trace::now_ns());
    }
  } done{c, t0, trace0, traced, collective};
  return f();
}

class TimedWork final : public Work {
 public:
  // p2p: sends and receives, whose waits pair different ranks per call.
  TimedWork(TimedCommunicator& c, std::unique_ptr<Work> w, const char* op, int64_t bytes, bool p2p = false)
      : c_(c), w_(std::move(w)), op_(op), bytes_(bytes), p2p_(p2p), issued_ns_(trace::now_ns()) {}
  // The run is traced where its busy time is counted, at the wait: a
  // collective issued before the recorded steps and waited inside them (ZeRO
  // 1-2's weight gathers run from one step into the next) is in both.
  void wait() override {
    const double blocked0 = c_.blocked_seconds();
    timed(c_, [&] { w_->wait(); }, Traced{op_, bytes_, false, "wait "}, !p2p_);
    const double busy = w_->busy_seconds();
    c_.add_busy(busy >= 0 ? busy : c_.blocked_seconds() - blocked0);
    if (trace::on()) trace_run();
  }
  double busy_seconds() const override { return w_->busy_seconds(); }
  std::pair<int64_t, int64_t> ran_ns() const override { return w_->ran_ns(); }

 private:
  TimedCommunicator& c_;
  std::unique_ptr<Work> w_;
  const char* op_;
  int64_t bytes_;
  bool p2p_ = false;
  int64_t issued_ns_ = 0;

  // The run on the backend's thread where it is known, else (and for sends
  // and receives, several of which are in flight at once) issue to completion.
  void trace_run() {
    const auto [r0, r1] = w_->ran_ns();
    const std::string name = std::string(op_) + " " + c_.label();
    std::string args = bytes_arg(bytes_) + ", \"group\": \"" + c_.name() + "\"";
    if (!p2p_ && r0 > 0 && r1 >= r0) {
      args += ", \"queued_ms\": " + std::to_string(double(r0 - issued_ns_) * 1e-6);
      trace::span_on("comm " + c_.label(), "comm", name, r0, r1, args);
    } else {
      trace::span_on((p2p_ ? "p2p " : "comm ") + c_.label(), "comm", name, issued_ns_, trace::now_ns(), args, true);
    }
  }
};

// An asynchronous collective: its issue timed as a wait of its own, its
// Work wrapped so that its wait and its run are timed too.
template <typename F>
std::unique_ptr<Work> timed_issue(TimedCommunicator& c, const char* op, int64_t bytes, F&& issue) {
  return std::make_unique<TimedWork>(c, timed(c, issue, Traced{op, bytes, false, "issue "}), op, bytes);
}

int64_t p2p_bytes(const std::vector<P2POp>& ops) {
  int64_t b = 0;
  for (const P2POp& op : ops) b += int64_t(op.tensor.nbytes());
  return b;
}

const char* p2p_name(const std::vector<P2POp>& ops) {
  bool sends = false, recvs = false;
  for (const P2POp& op : ops) (op.send ? sends : recvs) = true;
  return sends && recvs ? "send_recv" : sends ? "send" : "recv";
}

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
  timed(*this, [&] { inner_.all_reduce(t, op); }, Traced{"all_reduce", int64_t(t.nbytes()), true}, true);
}
void TimedCommunicator::do_reduce_scatter(Tensor out, Tensor in) {
  bytes_.add(CommKind::ReduceScatter, int64_t(in.nbytes()));
  timed(*this, [&] { inner_.reduce_scatter(out, in); }, Traced{"reduce_scatter", int64_t(in.nbytes()), true}, true);
}
void TimedCommunicator::do_all_gather(Tensor out, Tensor in) {
  bytes_.add(CommKind::AllGather, int64_t(out.nbytes()));
  timed(*this, [&] { inner_.all_gather(out, in); }, Traced{"all_gather", int64_t(out.nbytes()), true}, true);
}
void TimedCommunicator::do_broadcast(Tensor t, int root) {
  bytes_.add(CommKind::Broadcast, int64_t(t.nbytes()));
  timed(*this, [&] { inner_.broadcast(t, root); }, Traced{"broadcast", int64_t(t.nbytes()), true}, true);
}
void TimedCommunicator::do_all_to_all(Tensor out, Tensor in) {
  bytes_.add(CommKind::AllToAll, int64_t(in.nbytes()));
  timed(*this, [&] { inner_.all_to_all(out, in); }, Traced{"all_to_all", int64_t(in.nbytes()), true}, true);
}
void TimedCommunicator::do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                                     const std::vector<int64_t>& in_counts) {
  int64_t elems = 0;
  for (int64_t n : in_counts) elems += n;
  const int64_t b = elems * int64_t(dtype_size(in.dtype));
  bytes_.add(CommKind::AllToAll, b);
  timed(*this, [&] { inner_.all_to_all_v(out, out_counts, in, in_counts); }, Traced{"all_to_all_v", b, true}, true);
}
void TimedCommunicator::do_batch_send_recv(const std::vector<P2POp>& ops) {
  count_p2p(ops);
  timed(*this, [&] { inner_.batch_send_recv(ops); }, Traced{p2p_name(ops), p2p_bytes(ops), true});
}
std::unique_ptr<Work> TimedCommunicator::do_batch_send_recv_posted(const std::vector<P2POp>& ops) {
  count_p2p(ops);
  const int64_t b = p2p_bytes(ops);
  return std::make_unique<TimedWork>(
      *this, timed(*this, [&] { return inner_.batch_send_recv_posted(ops); }, Traced{"post", b}), p2p_name(ops), b,
      true);
}
std::unique_ptr<Work> TimedCommunicator::do_batch_send_recv_async(const std::vector<P2POp>& ops) {
  count_p2p(ops);
  const int64_t b = p2p_bytes(ops);
  return std::make_unique<TimedWork>(
      *this, timed(*this, [&] { return inner_.batch_send_recv_async(ops); }, Traced{"post", b}), p2p_name(ops), b,
      true);
}
std::unique_ptr<Work> TimedCommunicator::do_post_receives(const std::vector<P2POp>& receives) {
  const int64_t b = p2p_bytes(receives);
  std::unique_ptr<Work> w = timed(*this, [&] { return inner_.post_receives(receives); }, Traced{"recv", b, false, "post "});
  if (!w) return nullptr;
  count_p2p(receives);
  return std::make_unique<TimedWork>(*this, std::move(w), "recv", b, true);
}
void TimedCommunicator::do_barrier() {
  timed(*this, [&] { inner_.barrier(); }, Traced{"barrier", 0, true}, true);
}
std::unique_ptr<Work> TimedCommunicator::do_all_reduce_async(Tensor t) {
  bytes_.add(CommKind::AllReduce, int64_t(t.nbytes()));
  return timed_issue(*this, "all_reduce", int64_t(t.nbytes()), [&] { return inner_.all_reduce_async(t); });
}
std::unique_ptr<Work> TimedCommunicator::do_reduce_scatter_async(Tensor out, Tensor in) {
  bytes_.add(CommKind::ReduceScatter, int64_t(in.nbytes()));
  return timed_issue(*this, "reduce_scatter", int64_t(in.nbytes()), [&] { return inner_.reduce_scatter_async(out, in); });
}
std::unique_ptr<Work> TimedCommunicator::do_all_gather_async(Tensor out, Tensor in) {
  bytes_.add(CommKind::AllGather, int64_t(out.nbytes()));
  return timed_issue(*this, "all_gather", int64_t(out.nbytes()), [&] { return inner_.all_gather_async(out, in); });
}

}  // namespace trainer
