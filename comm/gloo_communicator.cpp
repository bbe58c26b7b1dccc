#include "comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "comm/collective_trace.h"
#include "comm/gloo_store_adapter.h"
#include "core/trace.h"

namespace trainer {

namespace {

using Clock = std::chrono::steady_clock;

// Our own point-to-point traffic gets slot prefixes that Gloo's collectives
// (0x01..0x08 in gloo/types.h) never use, so the two can never be confused.
constexpr uint8_t kRingSlot = 0x40;
constexpr uint8_t kP2PSlot = 0x41;

std::string seconds_text(double s) {
  char buf[32];
  if (s == double(int64_t(s)))
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(s));
  else
    std::snprintf(buf, sizeof buf, "%.3g", s);
  return buf;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + format_rank_list(ranks);
}

bool mentions_timeout(const std::string& what) {
  std::string s = what;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s.find("timed out") != std::string::npos || s.find("timeout") != std::string::npos;
}

char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data); }

// Only the spelling counts: a host name that resolves to a loopback alias on
// its own node (Debian's 127.0.1.1) still names a real host for the others.
bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// The first address of an interface that is up and not loopback, for when the
// route to the master is itself loopback (we are on its node).
std::string first_external_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) out = text;
  }
  freeifaddrs(list);
  return out;
}

// The source address the kernel would pick to reach `host`: connecting a UDP
// socket sends nothing but runs the routing decision.
std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return "";
  std::string out;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd >= 0) {
    if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      char text[INET_ADDRSTRLEN] = {};
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
          inet_ntop(AF_INET, &local.sin_addr, text, sizeof text))
        out = text;
    }
    close(fd);
  }
  freeaddrinfo(res);
  return out;
}

// What the worker measured of one task: its run time, and when it ran.
struct TaskTimes {
  std::atomic<double> busy{0};
  std::atomic<int64_t> start_ns{0}, end_ns{0};
};

class GlooWork final : public Work {
 public:
  GlooWork(std::shared_future<void> f, std::shared_ptr<TaskTimes> times) : f_(std::move(f)), times_(std::move(times)) {}
  void wait() override { f_.get(); }
  double busy_seconds() const override { return times_->busy.load(); }
  std::pair<int64_t, int64_t> ran_ns() const override { return {times_->start_ns.load(), times_->end_ns.load()}; }

 private:
  std::shared_future<void> f_;
  std::shared_ptr<TaskTimes> times_;  // the task's run on the worker
};

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

template <typename T>
ReduceFn reduce_fn(ReduceOp op) {
  return op == ReduceOp::Sum ? static_cast<ReduceFn>(&gloo::sum<T>) : static_cast<ReduceFn>(&gloo::max<T>);
}

}  // namespace

std::string gloo_local_address(const std::string& master_addr, bool single_host) {
  if (single_host || is_loopback_host(master_addr)) return "127.0.0.1";
  std::string a = route_source_address(master_addr);
  if (a.empty() || is_loopback_host(a)) a = first_external_address();
  if (!a.empty()) return a;
  // Nothing better known: the host name, which Gloo resolves itself.
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& master_addr, bool single_host) {
  // Gloo writes with writev(), so a peer that died would kill this rank with
  // SIGPIPE, silently, instead of failing the collective with a message that
  // names the group. Python (and so PyTorch) ignores SIGPIPE for the same
  // reason; a handler the program installed itself is left alone.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
  gloo::transport::tcp::attr attr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  std::string where;
  if (ifname && *ifname) {
    attr.iface = ifname;
    where = "interface " + std::string(ifname) + " (GLOO_SOCKET_IFNAME)";
  } else {
    attr.hostname = gloo_local_address(master_addr, single_host);
    where = "address " + attr.hostname;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw std::runtime_error("Gloo: cannot open a TCP device on " + where + ": " + e.what() +
                             " (set GLOO_SOCKET_IFNAME to the network interface the ranks share)");
  }
}

struct GlooCommunicator::Impl {
  Store& store;
  std::shared_ptr<gloo::transport::Device> device;
  std::string name;
  std::vector<int> members;
  int rank = 0;  // in the group
  int size = 1;
  double timeout_s = 600;
  std::chrono::milliseconds timeout{600000};
  std::string prefix;  // store key space of this communicator
  std::shared_ptr<gloo::rendezvous::Context> ctx;

  // Identical on every member as long as they issue the same collectives in
  // the same order, which is the contract; point-to-point traffic is not
  // collective and is counted per peer instead.
  uint32_t next_tag = 0;
  uint64_t collectives = 0;
  std::vector<uint32_t> sent, received;  // per peer

  std::string broken;  // the first failure; set once, under mu

  std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<std::packaged_task<void()>> queue;
  bool busy = false, stop = false;
  std::thread worker;

  Impl(Store& s, std::shared_ptr<gloo::transport::Device> d, GlooGroup g)
      : store(s), device(std::move(d)), name(std::move(g.name)), members(std::move(g.members)), timeout_s(g.timeout_s) {
    const auto me = std::find(members.begin(), members.end(), g.global_rank);
    if (me == members.end())
      throw std::invalid_argument("Gloo communicator " + name + ": rank " + std::to_string(g.global_rank) +
                                  " is not one of its members (" + format_rank_list(members) + ")");
    if (!(timeout_s > 0)) throw std::invalid_argument("Gloo communicator " + name + ": timeout must be > 0 s");
    rank = int(me - members.begin());
    size = int(members.size());
    timeout = std::chrono::milliseconds(std::max<int64_t>(1, int64_t(timeout_s * 1000.0)));
    prefix = "gloo/" + name + "/" + std::to_string(g.generation);
    sent.assign(size, 0);
    received.assign(size, 0);
  }

  std::string describe() const { return name + " (ranks " + format_rank_list(members) + ")"; }

  void connect() {
    if (size == 1) return;
    PrefixStore ps(store, prefix);
    // Meeting in the store first, under our own keys, lets a timeout name the
    // members that never came; Gloo's own wait would only name a key.
    ps.set("joined/" + std::to_string(rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back("joined/" + std::to_string(r));
    try {
      ps.wait(keys, timeout_s);
    } catch (const StoreTimeout&) {
      const auto got = ps.multi_get(keys);
      std::vector<int> missing;
      for (int r = 0; r < size; ++r)
        if (!got[r].present) missing.push_back(members[r]);
      throw CollectiveTimeout("creating communicator " + describe() + " timed out after " + seconds_text(timeout_s) +
                              " s: " + ranks_text(missing) + " never joined");
    }
    ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout);
    GlooStoreAdapter adapter(ps, timeout_s);
    try {
      ctx->connectFullMesh(adapter, device);
    } catch (const StoreTimeout& e) {
      throw CollectiveTimeout("connecting communicator " + describe() + ": " + e.what());
    } catch (const std::exception& e) {
      throw std::runtime_error("connecting communicator " + describe() + ": " + e.what());
    }
  }

  // --- running collectives -------------------------------------------------

  // After a failure the communicator is unusable; closing its connections
  // tells the members still waiting in the same collective at once, instead
  // of at their own timeout, so they can report within our grace period.
  void close_connections() {
    try {
      if (ctx) ctx->closeConnections();
    } catch (const std::exception&) {
    }
  }

  void check_usable(const char* op) {
    std::lock_guard<std::mutex> g(mu);
    if (!broken.empty())
      throw std::runtime_error(std::string(op) + " on group " + describe() +
                               ": the communicator is unusable after an earlier failure: " + broken);
  }

  // Runs one collective; Gloo's exceptions become ours, naming the group and
  // who is missing.
  void run_collective(const char* op, const std::function<void()>& fn) {
    check_usable(op);
    note_collective(op, describe());
    const uint64_t seq = ++collectives;
    try {
      fn();
    } catch (const gloo::IoException& e) {
      collective_failed(op, seq, e.what(), true);
    } catch (const gloo::EnforceNotMet& e) {
      collective_failed(op, seq, e.what(), false);
    } catch (const gloo::Exception& e) {
      collective_failed(op, seq, e.what(), false);
    }
  }

  // `io`: the transport failed (timeout, closed connection), rather than a
  // check inside Gloo (say, members that disagree on a size).
  [[noreturn]] void collective_failed(const char* op, uint64_t seq, const std::string& what, bool io) {
    {
      std::lock_guard<std::mutex> g(mu);
      if (broken.empty()) broken = std::string(op) + ": " + what;
    }
    bool timed_out = mentions_timeout(what);
    std::string who;
    try {
      // A member that did not reach this collective leaves no note; the ones
      // that did fail here too (their own timeout, or the connection that a
      // peer's timeout closed), shortly after us.
      const std::string base = prefix + "/failed/" + std::to_string(seq) + "/";
      store.set(base + std::to_string(rank), timed_out ? "timeout" : "error");
      close_connections();
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) keys.push_back(base + std::to_string(r));
      const double grace = collective_failure_grace_s(timeout_s);
      const auto deadline = Clock::now() + std::chrono::duration<double>(grace);
      std::vector<StoreEntry> notes;
      for (;;) {
        notes = store.multi_get(keys);
        const bool all = std::all_of(notes.begin(), notes.end(), [](const StoreEntry& e) { return e.present; });
        if (all || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      std::vector<int> missing, arrived;
      for (int r = 0; r < size; ++r) {
        (notes[r].present ? arrived : missing).push_back(members[r]);
        if (notes[r].present && notes[r].value == "timeout") timed_out = true;
      }
      if (missing.empty())
        who = io ? "every member reached it, so data stopped flowing between them (a network problem?)"
                 : "every member reached it";
      else
        // A rank without a note either never came or had already left: in a
        // ring, a member can finish before the one next to a stopped rank.
        who = ranks_text(missing) + " never joined it or had already left it (" + format_rank_list(arrived) +
              (arrived.size() == 1 ? " was" : " were") + " still in it)";
    } catch (const std::exception& e) {
      close_connections();
      who = "could not ask the store which ranks are missing (" + std::string(e.what()) + ")";
    }
    std::string msg = std::string(op) + " on group " + describe() +
                      (timed_out ? " timed out after " + seconds_text(timeout_s) + " s: " : " failed: ") + who +
                      " [gloo: " + what + "]";
    if (timed_out) throw CollectiveTimeout(msg);
    throw std::runtime_error(msg);
  }

  // Synchronous calls join the queue's order by waiting for it to empty;
  // only the owning thread issues calls, so nothing is queued meanwhile.
  void drain() {
    std::unique_lock<std::mutex> l(mu);
    idle.wait(l, [&] { return queue.empty() && !busy; });
  }

  std::unique_ptr<Work> submit(std::function<void()> fn) {
    auto times = std::make_shared<TaskTimes>();
    std::packaged_task<void()> task([fn = std::move(fn), times] {
      struct Timed {
        TaskTimes& times;
        int64_t t0 = trace::now_ns();
        ~Timed() {
          const int64_t t1 = trace::now_ns();
          times.start_ns.store(t0);
          times.end_ns.store(t1);
          times.busy.store(double(t1 - t0) * 1e-9);
        }
      } timed{*times};
      fn();
    });
    std::shared_future<void> f = task.get_future().share();
    {
      std::lock_guard<std::mutex> g(mu);
      queue.push_back(std::move(task));
      if (!worker.joinable()) worker = std::thread([this] { work_loop(); });
    }
    wake.notify_one();
    return std::make_unique<GlooWork>(std::move(f), std::move(times));
  }

  void work_loop() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      wake.wait(l, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      std::packaged_task<void()> task = std::move(queue.front());
      queue.pop_front();
      busy = true;
      l.unlock();
      task();  // the exception, if any, goes to the Work
      l.lock();
      busy = false;
      if (queue.empty()) idle.notify_all();
    }
  }

  // --- argument checks -----------------------------------------------------

  void need_host(const char* op, const char* what, const Tensor& t) const {
    if (t.device != Device::CPU)
      throw std::invalid_argument(std::string(op) + " on group " + describe() + ": " + what + " is a " +
                                  device_name(t.device) + " tensor; the Gloo backend moves host tensors only");
    if (t.empty() && t.numel() > 0)
      throw std::invalid_argument(std::string(op) + " on group " + describe() + ": " + what + " has no data");
  }

  void need_reducible(const char* op, const Tensor& t) const {
    if (t.dtype != DType::F32 && t.dtype != DType::F64 && t.dtype != DType::I32)
      throw std::invalid_argument(std::string(op) + " on group " + describe() + ": " + dtype_name(t.dtype) +
                                  " reductions are not supported on the CPU backend (F32, F64, I32 are)");
  }

  [[noreturn]] void bad(const char* op, const std::string& why) const {
    throw std::invalid_argument(std::string(op) + " on group " + describe() + ": " + why);
  }

  // --- the collectives (called by run_collective) --------------------------

  // The two halves of a ring, in place on n elements: chunk c is elements
  // [c n / size, (c + 1) n / size). Receives are posted before their sends,
  // and a send and a receive go through buffers of their own (they touch
  // different chunks): gloo's own allgather posts its sends first, and on a
  // shaped link took 1.7 times the link's time where this order takes 1.1;
  // one buffer for both cost a 64 KiB gather a few ms a call (`trainer
  // calibrate`, docs/PLANNING.md). One slot per call: messages between two
  // ranks on one slot arrive in the order their receives were posted.
  size_t ring_first(size_t c, size_t n) const { return c * n / size_t(size); }
  size_t ring_chunk(int c) const { return size_t(((c % size) + size) % size); }

  // The reduce half: size - 1 steps, each passing on the chunk reduced so
  // far and reducing into its own the one that arrives; then chunk `rank`
  // holds every rank's contribution, reduced in ring order.
  template <typename T>
  void ring_reduce(T* data, size_t n, ReduceOp op) {
    std::vector<T> from_left(n / size_t(size) + 1);  // a chunk is at most ceil(n / size)
    auto send_buf = ctx->createUnboundBuffer(data, n * sizeof(T));
    auto recv_buf = ctx->createUnboundBuffer(from_left.data(), from_left.size() * sizeof(T));
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    const uint64_t slot = gloo::Slot::build(kRingSlot, next_tag++);
    for (int s = 0; s < size - 1; ++s) {
      const size_t out = ring_chunk(rank - s - 1), in = ring_chunk(rank - s - 2);
      const size_t in_n = ring_first(in + 1, n) - ring_first(in, n);
      recv_buf->recv(left, slot, 0, in_n * sizeof(T));
      const size_t out_n = ring_first(out + 1, n) - ring_first(out, n);
      send_buf->send(right, slot, ring_first(out, n) * sizeof(T), out_n * sizeof(T));
      recv_buf->waitRecv(timeout);
      T* dst = data + ring_first(in, n);
      if (op == ReduceOp::Sum)
        for (size_t i = 0; i < in_n; ++i) dst[i] += from_left[i];
      else
        for (size_t i = 0; i < in_n; ++i) dst[i] = std::max(dst[i], from_left[i]);
      send_buf->waitSend(timeout);
    }
  }

  // The gather half: size - 1 steps, each passing on the complete chunk that
  // came from the left one step before (its own first); elements of `elem` bytes.
  void ring_gather(char* base, size_t n, size_t elem) {
    auto to_right = ctx->createUnboundBuffer(base, n * elem);
    auto from_left = ctx->createUnboundBuffer(base, n * elem);
    const int right = (rank + 1) % size, left = (rank + size - 1) % size;
    const uint64_t slot = gloo::Slot::build(kRingSlot, next_tag++);
    auto bounds = [&](size_t c) {  // offset and length in bytes
      return std::make_pair(ring_first(c, n) * elem, (ring_first(c + 1, n) - ring_first(c, n)) * elem);
    };
    for (int s = 0; s < size - 1; ++s) {
      const auto [in_at, in_bytes] = bounds(ring_chunk(rank - s - 1));
      const auto [out_at, out_bytes] = bounds(ring_chunk(rank - s));
      from_left->recv(left, slot, in_at, in_bytes);
      to_right->send(right, slot, out_at, out_bytes);
      from_left->waitRecv(timeout);
      to_right->waitSend(timeout);
    }
  }

  // An all-reduce of at least kRingMinElements per rank runs both halves:
  // every chunk is reduced once, by its owner, and copied to the others, so
  // all ranks hold the same bits. gloo::allreduce paid 2-4 ms per call now
  // and then at 64-256 KiB on a shaped link where these rings did not
  // (`trainer calibrate`, docs/PLANNING.md); smaller tensors keep it.
  static constexpr size_t kRingMinElements = 1024;

  template <typename T>
  void ring_all_reduce(T* data, size_t n, ReduceOp op) {
    if (size == 2) return pair_all_reduce(data, n, op);
    ring_reduce(data, n, op);
    ring_gather(reinterpret_cast<char*>(data), n, sizeof(T));
  }

  // Two ranks: each sends the other its whole tensor and adds what arrives,
  // the same bytes as the ring's two halves in one exchange. Every Gloo
  // message waits for both ranks' transport threads to trade ready notes,
  // and on shared cores such a hand-off can wait milliseconds: one exchange
  // has half of them (tp2's waits fell 25-35% on 2 cores, docs/PERFORMANCE.md).
  template <typename T>
  void pair_all_reduce(T* data, size_t n, ReduceOp op) {
    std::vector<T> other(n);
    auto mine = ctx->createUnboundBuffer(data, n * sizeof(T));
    auto theirs = ctx->createUnboundBuffer(other.data(), n * sizeof(T));
    const int peer = 1 - rank;
    const uint64_t slot = gloo::Slot::build(kRingSlot, next_tag++);
    theirs->recv(peer, slot, 0, n * sizeof(T));
    mine->send(peer, slot, 0, n * sizeof(T));
    theirs->waitRecv(timeout);
    mine->waitSend(timeout);
    // Rank 0's value first on both ranks: the same expression, the same
    // bits even where order shows (max with a NaN, a NaN's payload).
    const T* first = rank == 0 ? data : other.data();
    const T* second = rank == 0 ? other.data() : data;
    if (op == ReduceOp::Sum)
      for (size_t i = 0; i < n; ++i) data[i] = first[i] + second[i];
    else
      for (size_t i = 0; i < n; ++i) data[i] = std::max(first[i], second[i]);
  }

  void do_all_reduce(Tensor t, ReduceOp op) {
    if (size_t(t.numel()) >= kRingMinElements * size_t(size)) {
      switch (t.dtype) {
        case DType::F32: return ring_all_reduce(static_cast<float*>(t.data), size_t(t.numel()), op);
        case DType::F64: return ring_all_reduce(static_cast<double*>(t.data), size_t(t.numel()), op);
        default: return ring_all_reduce(static_cast<int32_t*>(t.data), size_t(t.numel()), op);
      }
    }
    gloo::AllreduceOptions o(ctx);
    o.setTimeout(timeout);
    o.setTag(next_tag++);
    const size_t n = size_t(t.numel());
    switch (t.dtype) {
      case DType::F32:
        o.setOutput(static_cast<float*>(t.data), n);
        o.setReduceFunction(reduce_fn<float>(op));
        break;
      case DType::F64:
        o.setOutput(static_cast<double*>(t.data), n);
        o.setReduceFunction(reduce_fn<double>(op));
        break;
      default:
        o.setOutput(static_cast<int32_t*>(t.data), n);
        o.setReduceFunction(reduce_fn<int32_t>(op));
        break;
    }
    gloo::allreduce(o);
  }

  // Reduce-scatter: the reduce half of the ring on a copy of `in`; each
  // rank keeps its own chunk. Moves (size-1)/size of the data per rank, half
  // of what all-reduce would.
  template <typename T>
  void ring_reduce_scatter(T* out, const T* in, size_t chunk) {
    std::vector<T> acc(in, in + chunk * size_t(size));
    ring_reduce(acc.data(), acc.size(), ReduceOp::Sum);
    std::memcpy(out, acc.data() + size_t(rank) * chunk, chunk * sizeof(T));
  }

  void do_reduce_scatter(Tensor out, Tensor in) {
    const size_t chunk = size_t(out.numel());
    switch (in.dtype) {
      case DType::F32: return ring_reduce_scatter(static_cast<float*>(out.data), static_cast<const float*>(in.data), chunk);
      case DType::F64:
        return ring_reduce_scatter(static_cast<double*>(out.data), static_cast<const double*>(in.data), chunk);
      default:
        return ring_reduce_scatter(static_cast<int32_t*>(out.data), static_cast<const int32_t*>(in.data), chunk);
    }
  }

  // What only this backend refuses (the shapes are checked by the caller,
  // comm/collective_checks.h).
  void check_reduce_scatter(Tensor out, Tensor in) const {
    const char* op = "reduce_scatter";
    need_host(op, "out", out);
    need_host(op, "in", in);
    need_reducible(op, in);
  }

  void reduce_scatter(Tensor out, Tensor in) {
    if (size == 1 || out.numel() == 0) {
      if (out.data != in.data) std::memmove(out.data, in.data, out.nbytes());
      return;
    }
    run_collective("reduce_scatter", [&] { do_reduce_scatter(out, in); });
  }

  void check_all_gather(Tensor out, Tensor in) const {
    need_host("all_gather", "out", out);
    need_host("all_gather", "in", in);
  }

  void all_gather(Tensor out, Tensor in) {
    if (in.numel() == 0) return;
    // Gloo gathers in place when given no input: put ours into our own slot.
    char* own = bytes_of(out) + size_t(rank) * in.nbytes();
    if (own != in.data) std::memmove(own, in.data, in.nbytes());
    if (size == 1) return;
    run_collective("all_gather", [&] { ring_gather(bytes_of(out), out.nbytes(), 1); });
  }

  void check_all_reduce(Tensor t) const {
    need_host("all_reduce", "the tensor", t);
    need_reducible("all_reduce", t);
  }

  void all_reduce(Tensor t, ReduceOp op) {
    if (size == 1 || t.numel() == 0) return;
    run_collective("all_reduce", [&] { do_all_reduce(t, op); });
  }
};

GlooCommunicator::GlooCommunicator(Store& store, std::shared_ptr<gloo::transport::Device> device, GlooGroup group)
    : impl_(std::make_unique<Impl>(store, std::move(device), std::move(group))) {
  impl_->connect();
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  // Queued collectives still run (their Work may be waited on elsewhere);
  // each ends at the latest at its timeout.
  if (impl_->worker.joinable()) impl_->worker.join();
}

int GlooCommunicator::rank() const { return impl_->rank; }
int GlooCommunicator::size() const { return impl_->size; }
const std::string& GlooCommunicator::name() const { return impl_->name; }
const std::vector<int>& GlooCommunicator::members() const { return impl_->members; }

void GlooCommunicator::do_all_reduce(Tensor t, ReduceOp op) {
  impl_->check_all_reduce(t);
  impl_->drain();
  impl_->all_reduce(t, op);
}

std::unique_ptr<Work> GlooCommunicator::do_all_reduce_async(Tensor t) {
  impl_->check_all_reduce(t);
  Impl* m = impl_.get();
  return m->submit([m, t] { m->all_reduce(t, ReduceOp::Sum); });
}

void GlooCommunicator::do_reduce_scatter(Tensor out, Tensor in) {
  impl_->check_reduce_scatter(out, in);
  impl_->drain();
  impl_->reduce_scatter(out, in);
}

std::unique_ptr<Work> GlooCommunicator::do_reduce_scatter_async(Tensor out, Tensor in) {
  impl_->check_reduce_scatter(out, in);
  Impl* m = impl_.get();
  return m->submit([m, out, in] { m->reduce_scatter(out, in); });
}

void GlooCommunicator::do_all_gather(Tensor out, Tensor in) {
  impl_->check_all_gather(out, in);
  impl_->drain();
  impl_->all_gather(out, in);
}

std::unique_ptr<Work> GlooCommunicator::do_all_gather_async(Tensor out, Tensor in) {
  impl_->check_all_gather(out, in);
  Impl* m = impl_.get();
  // `in` is read on the worker, after the collectives queued before it: it
  // may be what one of them produces (a reduce-scatter's shard).
  return m->submit([m, out, in] { m->all_gather(out, in); });
}

void GlooCommunicator::do_broadcast(Tensor t, int root) {
  Impl& m = *impl_;
  const char* op = "broadcast";
  m.need_host(op, "the tensor", t);
  m.drain();
  if (m.size == 1 || t.numel() == 0) return;
  m.run_collective(op, [&] {
    gloo::BroadcastOptions o(m.ctx);
    // The root sends from its output buffer when given no input.
    o.setOutput(bytes_of(t), t.nbytes());
    o.setRoot(root);
    o.setTag(m.next_tag++);
    o.setTimeout(m.timeout);
    gloo::broadcast(o);
  });
}

void GlooCommunicator::do_all_to_all(Tensor out, Tensor in) {
  Impl& m = *impl_;
  const char* op = "all_to_all";
  m.need_host(op, "out", out);
  m.need_host(op, "in", in);
  m.drain();
  if (in.numel() == 0) return;
  if (m.size == 1) {
    if (out.data != in.data) std::memmove(out.data, in.data, in.nbytes());
    return;
  }
  // Gloo reads the input while writing the output: an aliased input is
  // copied first.
  std::vector<char> copy;
  const char* src = bytes_of(in);
  const size_t n = in.nbytes();
  if (src < bytes_of(out) + n && bytes_of(out) < src + n) {
    copy.assign(src, src + n);
    src = copy.data();
  }
  m.run_collective(op, [&] {
    gloo::AlltoallOptions o(m.ctx);
    o.setInput(const_cast<char*>(src), n);
    o.setOutput(bytes_of(out), n);
    o.setTag(m.next_tag++);
    o.setTimeout(m.timeout);
    gloo::alltoall(o);
  });
}

void GlooCommunicator::do_all_to_all_v(Tensor out, const std::vector<int64_t>& out_counts, Tensor in,
                                    const std::vector<int64_t>& in_counts) {
  Impl& m = *impl_;
  const char* op = "all_to_all_v";
  m.need_host(op, "out", out);
  m.need_host(op, "in", in);
  int64_t in_total = 0, out_total = 0;
  for (int p = 0; p < m.size; ++p) {
    in_total += in_counts[size_t(p)];
    out_total += out_counts[size_t(p)];
  }
  m.drain();
  const size_t esize = dtype_size(in.dtype);
  if (m.size == 1) {
    if (out.data != in.data) std::memmove(out.data, in.data, size_t(in_counts[0]) * esize);
    return;
  }
  // A rank with nothing to send or receive skips Gloo (its peers' counts with
  // it are zero too), but still counts the collective to stay in step.
  const uint32_t tag = m.next_tag++;
  if (in_total == 0 && out_total == 0) {
    m.check_usable(op);
    ++m.collectives;
    return;
  }
  std::vector<char> copy;
  const char* src = bytes_of(in);
  const size_t in_bytes = size_t(in_total) * esize, out_bytes = size_t(out_total) * esize;
  if (in_bytes > 0 && out_bytes > 0 && src < bytes_of(out) + out_bytes && bytes_of(out) < src + in_bytes) {
    copy.assign(src, src + in_bytes);
    src = copy.data();
  }
  std::vector<int64_t> in_b(m.size), out_b(m.size);
  for (int p = 0; p < m.size; ++p) {
    in_b[p] = in_counts[p] * int64_t(esize);
    out_b[p] = out_counts[p] * int64_t(esize);
  }
  // Gloo wants a buffer even for zero bytes.
  static char dummy[1];
  char* in_ptr = in_bytes ? const_cast<char*>(src) : dummy;
  char* out_ptr = out_bytes ? bytes_of(out) : dummy;
  m.run_collective(op, [&] {
    gloo::AlltoallvOptions o(m.ctx);
    o.setInput(in_ptr, in_b);
    o.setOutput(out_ptr, out_b);
    o.setTag(tag);
    o.setTimeout(m.timeout);
    gloo::alltoallv(o);
  });
}

// A posted point-to-point message: its buffer and what an error names.
struct GlooCommunicator::PostedMessage {
  bool send = true;
  int peer = 0;  // group rank
  size_t bytes = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf;
};

// Waits for one posted message; a failure breaks the communicator and names
// the peer, the direction and the bytes.
void GlooCommunicator::wait_message(PostedMessage& p) {
  Impl& m = *impl_;
  const char* op = "batch_send_recv";
  try {
    if (p.send)
      p.buf->waitSend(m.timeout);
    else
      p.buf->waitRecv(m.timeout);
  } catch (const gloo::Exception& e) {
    const std::string what = e.what();
    {
      std::lock_guard<std::mutex> g(m.mu);
      if (m.broken.empty()) m.broken = std::string(op) + ": " + what;
    }
    m.close_connections();
    const std::string peer = "rank " + std::to_string(m.members[p.peer]);
    const std::string dir = p.send ? "sending " + std::to_string(p.bytes) + " bytes to " + peer
                                   : "receiving " + std::to_string(p.bytes) + " bytes from " + peer;
    if (mentions_timeout(what))
      throw CollectiveTimeout(std::string(op) + " on group " + m.describe() + " timed out after " +
                              seconds_text(m.timeout_s) + " s " + dir + " [gloo: " + what + "]");
    throw std::runtime_error(std::string(op) + " on group " + m.describe() + " failed " + dir + " [gloo: " + what + "]");
  }
}

// The sends of a batch still on their way.
class GlooSendWork final : public Work {
 public:
  GlooSendWork(GlooCommunicator& c, std::vector<GlooCommunicator::PostedMessage> sends) : c_(c), sends_(std::move(sends)) {}
  void wait() override {
    for (GlooCommunicator::PostedMessage& p : sends_)
      if (p.buf) {
        c_.wait_message(p);
        p.buf.reset();
      }
  }

 private:
  GlooCommunicator& c_;
  std::vector<GlooCommunicator::PostedMessage> sends_;
};

// Receives still on their way, then the batch's sends (batch_send_recv_async).
class GlooBatchWork final : public Work {
 public:
  GlooBatchWork(GlooCommunicator& c, std::vector<GlooCommunicator::PostedMessage> recvs,
                std::unique_ptr<Work> sends)
      : c_(c), recvs_(std::move(recvs)), sends_(std::move(sends)) {}
  void wait() override {
    for (GlooCommunicator::PostedMessage& p : recvs_)
      if (p.buf) {
        c_.wait_message(p);
        p.buf.reset();
      }
    if (sends_) sends_->wait();
  }

 private:
  GlooCommunicator& c_;
  std::vector<GlooCommunicator::PostedMessage> recvs_;
  std::unique_ptr<Work> sends_;
};

void GlooCommunicator::do_batch_send_recv(const std::vector<P2POp>& ops) { do_batch_send_recv_posted(ops)->wait(); }

std::unique_ptr<Work> GlooCommunicator::do_batch_send_recv_posted(const std::vector<P2POp>& ops) {
  std::vector<PostedMessage> recvs;
  std::unique_ptr<Work> sends = post_batch(ops, recvs);
  for (PostedMessage& p : recvs) wait_message(p);
  return sends;
}

std::unique_ptr<Work> GlooCommunicator::do_batch_send_recv_async(const std::vector<P2POp>& ops) {
  std::vector<PostedMessage> recvs;
  std::unique_ptr<Work> sends = post_batch(ops, recvs);
  return std::make_unique<GlooBatchWork>(*this, std::move(recvs), std::move(sends));
}

// Gloo's transport takes a posted receive's data whenever its sender posts.
std::unique_ptr<Work> GlooCommunicator::do_post_receives(const std::vector<P2POp>& receives) {
  std::vector<PostedMessage> recvs;
  std::unique_ptr<Work> none = post_batch(receives, recvs);
  return std::make_unique<GlooBatchWork>(*this, std::move(recvs), std::move(none));
}

std::unique_ptr<Work> GlooCommunicator::post_batch(const std::vector<P2POp>& ops, std::vector<PostedMessage>& recvs) {
  Impl& m = *impl_;
  const char* op = "batch_send_recv";
  for (const P2POp& p : ops) m.need_host(op, p.send ? "a send tensor" : "a receive tensor", p.tensor);
  // Messages to ourselves (paired up by the caller's check): the k-th send
  // meets the k-th receive.
  std::vector<const P2POp*> self_sends, self_recvs;
  for (const P2POp& p : ops)
    if (p.peer == m.rank && p.tensor.nbytes() > 0) (p.send ? self_sends : self_recvs).push_back(&p);
  m.drain();
  m.check_usable(op);
  for (size_t i = 0; i < self_sends.size(); ++i)
    std::memmove(self_recvs[i]->tensor.data, self_sends[i]->tensor.data, self_sends[i]->tensor.nbytes());

  std::vector<PostedMessage> sends;
  // Receives first, so that every incoming message finds its buffer.
  for (int pass = 0; pass < 2; ++pass) {
    const bool sending = pass == 1;
    for (const P2POp& p : ops) {
      if (p.send != sending || p.peer == m.rank || p.tensor.nbytes() == 0) continue;
      auto buf = m.ctx->createUnboundBuffer(p.tensor.data, p.tensor.nbytes());
      // The k-th message from A to B uses slot k on both sides.
      uint32_t& count = sending ? m.sent[p.peer] : m.received[p.peer];
      const uint64_t slot = gloo::Slot::build(kP2PSlot, count++);
      try {
        if (sending)
          buf->send(p.peer, slot);
        else
          buf->recv(p.peer, slot);
      } catch (const gloo::Exception& e) {
        std::lock_guard<std::mutex> g(m.mu);
        if (m.broken.empty()) m.broken = std::string(op) + ": " + e.what();
        m.close_connections();
        throw std::runtime_error(std::string(op) + " on group " + m.describe() + ": posting a " +
                                 (sending ? "send to" : "receive from") + " rank " + std::to_string(m.members[p.peer]) +
                                 " failed: " + e.what());
      }
      (sending ? sends : recvs).push_back({sending, p.peer, p.tensor.nbytes(), std::move(buf)});
    }
  }
  return std::make_unique<GlooSendWork>(*this, std::move(sends));
}

void GlooCommunicator::do_barrier() {
  Impl& m = *impl_;
  m.drain();
  if (m.size == 1) return;
  m.run_collective("barrier", [&] {
    gloo::BarrierOptions o(m.ctx);
    o.setTag(m.next_tag++);
    o.setTimeout(m.timeout);
    gloo::barrier(o);
  });
}

}  // namespace trainer
