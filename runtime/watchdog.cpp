#include "runtime/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <future>

#include "comm/collective_trace.h"
#include "comm/communicator.h"
#include "comm/mesh.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "comm/store_secret.h"

namespace trainer {

namespace {

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", s);
  return b;
}

// A summary of many ranks stays one readable line.
constexpr size_t kMaxListed = 8;

// How long the timer and the error path wait for the heartbeat thread's store
// call (normally milliseconds; seconds when the store hangs).
constexpr double kLockWaitS = 1.5;

std::string failed_key(int rank) { return "watchdog/failed/" + std::to_string(rank); }

// Everything to stderr with write(2): no stdio lock, no buffer, so a main
// thread that is stuck inside stdio cannot hold the message back.
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += size_t(n);
  }
}

}  // namespace

double default_watchdog_grace_s(double timeout_s) { return collective_failure_grace_s(timeout_s) + 3.0; }

std::function<void()> abort_communicators(ProcessGroups& pg) {
  return [&pg] {
    auto one = [](Communicator& c) {
      try {
        c.abort();
      } catch (...) {
      }
    };
    one(pg.world());
    for (Axis a : kAllAxes) one(pg.group(a));
    try {
      one(pg.host_world());  // throws when a CUDA run has none
    } catch (...) {
    }
  };
}

Watchdog::Watchdog(WatchdogOptions options) : opt_(std::move(options)) {
  if (!(opt_.timeout_s > 0)) throw std::invalid_argument("watchdog: parallel.timeout_s must be > 0");
  if (opt_.world < 1 || opt_.rank < 0 || opt_.rank >= opt_.world)
    throw std::invalid_argument("watchdog: rank " + std::to_string(opt_.rank) + " outside a world of " +
                                std::to_string(opt_.world));
  if (opt_.token.empty()) opt_.token = job_token_from_env();
  if (!opt_.secret) opt_.secret = store_secret_from_env();
  interval_s_ = std::clamp(opt_.timeout_s / 4, 0.05, 1.0);
  stale_after_s_ = std::max(3 * interval_s_, 1.0);
  dead_after_s_ = std::max(stale_after_s_, 10.0);
  grace_s_ = opt_.grace_s >= 0 ? opt_.grace_s : default_watchdog_grace_s(opt_.timeout_s);
  request_timeout_s_ = std::clamp(opt_.timeout_s / 2, 1.0, 5.0);
  try {
    client_ = std::make_unique<StoreClient>(opt_.host, opt_.port, opt_.token, std::min(opt_.timeout_s, 10.0),
                                            request_timeout_s_, *opt_.secret);
  } catch (const std::exception& e) {
    store_error_ = e.what();  // the heartbeat thread retries; the summary says so meanwhile
  }
  heartbeat_thread_ = std::thread([this] { heartbeat_loop(); });
  timer_thread_ = std::thread([this] { timer_loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> g(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (timer_thread_.joinable()) timer_thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

void Watchdog::progress(int64_t step, const char* phase) {
  step_.store(step, std::memory_order_relaxed);
  phase_.store(phase, std::memory_order_relaxed);
  last_progress_ns_.store(std::max<int64_t>(1, Clock::now().time_since_epoch().count()), std::memory_order_release);
}

std::string Watchdog::where() const {
  return "step " + std::to_string(step_.load(std::memory_order_relaxed)) + " (" +
         phase_.load(std::memory_order_relaxed) + ")";
}

bool Watchdog::with_store(const std::function<void(StoreClient&)>& fn, std::string* error, bool heartbeat_thread) {
  {
    std::unique_lock<std::mutex> g(store_mu_);
    const auto free = [&] { return !store_busy_; };
    if (heartbeat_thread) {
      store_cv_.wait(g, free);
    } else if (!store_cv_.wait_for(g, std::chrono::duration<double>(kLockWaitS), free)) {
      if (error) *error = "a heartbeat sent to it has not returned for over " + seconds(kLockWaitS) + " s";
      return false;
    }
    store_busy_ = true;
  }
  struct Release {
    Watchdog& w;
    ~Release() {
      {
        std::lock_guard<std::mutex> g(w.store_mu_);
        w.store_busy_ = false;
      }
      w.store_cv_.notify_all();
    }
  } release{*this};
  auto failed = [&](const std::string& why) {
    std::lock_guard<std::mutex> e(error_mu_);
    if (!why.empty()) store_error_ = why;
    if (error) *error = store_error_;
    return false;
  };
  try {
    // A dropped connection is unusable: the heartbeat thread makes a new one.
    if (!client_) {
      if (!heartbeat_thread) return failed("");
      client_ = std::make_unique<StoreClient>(opt_.host, opt_.port, opt_.token, std::min(interval_s_, 1.0),
                                              request_timeout_s_, *opt_.secret);
    }
    fn(*client_);
    return true;
  } catch (const std::exception& e) {
    client_.reset();
    return failed(e.what());
  }
}

std::string Watchdog::summarize(int64_t my_step, std::string* error) {
  std::vector<Heartbeat> hb;
  if (!with_store([&](StoreClient& c) { hb = c.read_heartbeats(opt_.world); }, error, false)) return "";
  if (const int j = judged_rank_.load(); j >= 0 && size_t(j) < hb.size() && hb[size_t(j)].present)
    hb[size_t(j)].age_s = std::max(hb[size_t(j)].age_s, judged_silent_s_.load());
  std::vector<std::string> items;
  int64_t lo = my_step, hi = my_step;
  for (const Heartbeat& h : hb) {
    if (h.rank == opt_.rank) continue;
    if (!h.present) {
      items.push_back("rank " + std::to_string(h.rank) + " sent no heartbeat");
      continue;
    }
    lo = std::min(lo, h.step);
    hi = std::max(hi, h.step);
    if (h.age_s > stale_after_s_)
      items.push_back("rank " + std::to_string(h.rank) + " last at step " + std::to_string(h.step) + ", " +
                      seconds(h.age_s) + " s ago (stale)");
    else if (h.step < my_step)
      items.push_back("rank " + std::to_string(h.rank) + " at step " + std::to_string(h.step) + " (behind, alive " +
                      seconds(h.age_s) + " s ago)");
  }
  const std::string lost = lost_nodes(hb);
  if (!lost.empty()) items.insert(items.begin(), lost);
  if (items.empty())
    return "no rank is stale or behind (" + std::to_string(opt_.world) + " ranks at steps " + std::to_string(lo) +
           ".." + std::to_string(hi) + ")";
  std::string s;
  for (size_t i = 0; i < items.size() && i < kMaxListed; ++i) s += (i ? "; " : "") + items[i];
  if (items.size() > kMaxListed) s += "; and " + std::to_string(items.size() - kMaxListed) + " more";
  return s;
}

void Watchdog::set_places(std::vector<std::string> host_of_rank) {
  std::lock_guard<std::mutex> g(places_mu_);
  host_of_rank_ = std::move(host_of_rank);
}

std::vector<std::string> Watchdog::places() {
  std::lock_guard<std::mutex> g(places_mu_);
  return host_of_rank_;
}

// Nodes other than this rank's whose every rank is stale or never beat: a
// host or its link is down, which says more than a list of its ranks.
std::string Watchdog::lost_nodes(const std::vector<Heartbeat>& hb) {
  const std::vector<std::string> host = places();
  if (host.size() != size_t(opt_.world) || hb.size() != host.size()) return "";
  std::vector<std::string> order;
  for (const std::string& h : host)
    if (h != host[size_t(opt_.rank)] && std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
  std::string s;
  for (const std::string& node : order) {
    std::vector<int> ranks;
    double newest = -1;
    bool all_silent = true;
    for (int r = 0; r < opt_.world; ++r) {
      if (host[size_t(r)] != node) continue;
      ranks.push_back(r);
      const Heartbeat& h = hb[size_t(r)];
      if (h.present && h.age_s <= stale_after_s_) all_silent = false;
      if (h.present) newest = newest < 0 ? h.age_s : std::min(newest, h.age_s);
    }
    if (!all_silent) continue;
    s += (s.empty() ? "" : "; ") + std::string("node ") + node + (ranks.size() == 1 ? " (rank " : " (ranks ") +
         format_rank_list(ranks) +
         ") is lost: none of its ranks " +
         (newest < 0 ? std::string("ever sent a heartbeat") : "has sent a heartbeat for " + seconds(newest) + " s") +
         " (the host, or its network link, is down)";
  }
  return s;
}

// The store is served by rank 0: from another node, not reaching it means
// this node is the one cut off (or rank 0's node is down).
std::string Watchdog::unreachable_store_note() {
  const std::vector<std::string> host = places();
  if (host.size() != size_t(opt_.world) || host[0] == host[size_t(opt_.rank)]) return "";
  return "; the store is served by rank 0 on node " + host[0] + ", which this node (" + host[size_t(opt_.rank)] +
         ") cannot reach: this node's network link, or that node, is down";
}

std::string Watchdog::describe_peers() {
  try {
    std::string error;
    std::string s = summarize(step_.load(std::memory_order_relaxed), &error);
    if (s.empty()) return "store unreachable (" + error + ")" + unreachable_store_note();
    return s;
  } catch (const std::exception& e) {
    return std::string("could not read the heartbeats (") + e.what() + ")";
  }
}

std::string Watchdog::gone_among(const std::vector<int>& ranks) {
  try {
    std::vector<Heartbeat> hb;
    if (!with_store([&](StoreClient& c) { hb = c.read_heartbeats(opt_.world); }, nullptr, false)) return "";
    const std::vector<std::string> host = places();
    std::string s;
    for (int r : ranks) {
      if (r < 0 || r >= int(hb.size()) || r == opt_.rank) continue;
      const Heartbeat& h = hb[size_t(r)];
      if (!h.present || h.age_s <= stale_after_s_) continue;
      s += (s.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
           (size_t(r) < host.size() ? " on node " + host[size_t(r)] : std::string()) + ": last heartbeat " +
           seconds(h.age_s) + " s ago, at step " + std::to_string(h.step) + ", dead or stopped";
    }
    return s;
  } catch (const std::exception&) {
    return "";
  }
}

bool Watchdog::wait_stop(double seconds) {
  std::unique_lock<std::mutex> l(stop_mu_);
  return stop_cv_.wait_for(l, std::chrono::duration<double>(seconds), [&] { return stop_; });
}

// Publishes this rank's step every interval, whatever the main thread does;
// while the main thread is blocked, also looks at the others.
void Watchdog::heartbeat_loop() {
  do {
    const int64_t step = step_.load(std::memory_order_relaxed);
    with_store([&](StoreClient& c) { c.set_heartbeat(opt_.rank, step); }, nullptr, true);
    look_for_dead_peer();
  } while (!wait_stop(interval_s_));
}

// Reads the heartbeats only when this rank has made no progress for a
// heartbeat's staleness: a running job pays nothing (every rank reading every
// rank's heartbeat each second would grow with the square of the world).
void Watchdog::look_for_dead_peer() {
  const int64_t last = last_progress_ns_.load(std::memory_order_acquire);
  if (last == 0 || opt_.world < 2) return;
  const double idle = std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(last)).count();
  if (idle < stale_after_s_) {
    silent_rank_.store(-1);
    return;
  }
  std::vector<Heartbeat> hb;
  if (!with_store([&](StoreClient& c) { hb = c.read_heartbeats(opt_.world); }, nullptr, true)) return;
  int who = -1;
  double longest = 0;
  for (const Heartbeat& h : hb)
    if (h.rank != opt_.rank && h.present && h.age_s > longest) who = h.rank, longest = h.age_s;
  silent_s_.store(longest);
  silent_at_ns_.store(Clock::now().time_since_epoch().count());
  silent_rank_.store(who);
}

// Never touches the store until it fires, so a store call that hangs cannot
// delay it.
void Watchdog::timer_loop() {
  const double limit_s = opt_.timeout_s + grace_s_;
  do {
    const int64_t last = last_progress_ns_.load(std::memory_order_acquire);
    if (last == 0) continue;  // not armed yet
    const double idle =
        std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(last)).count();
    if (idle > limit_s) fire(idle);
    // A dead peer while this rank is blocked (the heartbeat thread's look).
    const int who = silent_rank_.load();
    if (who >= 0 && idle >= stale_after_s_) {
      const double since_look =
          std::chrono::duration<double>(Clock::now().time_since_epoch() - Clock::duration(silent_at_ns_.load())).count();
      const double silent = silent_s_.load() + since_look;
      bool (*stop)() = stop_requested_.load();
      const double limit = stop && stop() ? stale_after_s_ : dead_after_s_;
      // Only when it comes before the collective's own timeout, whose error
      // names the collective precisely.
      if (limit < opt_.timeout_s && silent > limit) fire_dead_peer(idle, who, silent);
    }
  } while (!wait_stop(std::min(interval_s_, 0.25)));
}

void Watchdog::fire_dead_peer(double idle_s, int rank, double silent_s) {
  bool (*stop)() = stop_requested_.load();
  const std::string line = "watchdog: rank " + std::to_string(opt_.rank) + " has been blocked for " + seconds(idle_s) +
                           " s at " + where() + " while rank " + std::to_string(rank) + " sent no heartbeat for " +
                           seconds(silent_s) + " s (dead or stopped" +
                           (stop && stop() ? "; a stop was requested" : "") + "): not waiting out parallel.timeout_s " +
                           seconds(opt_.timeout_s) + " s";
  judged_silent_s_.store(silent_s);
  judged_rank_.store(rank);
  fire(idle_s, line);
}


void Watchdog::fire(double idle_s, const std::string& headline) {
  const std::string peers = describe_peers();
  const std::string last = last_collective();
  const std::string what = !headline.empty()
                               ? headline
                               : "watchdog: rank " + std::to_string(opt_.rank) + " made no progress for " +
                                     seconds(idle_s) + " s at " + where() + " (parallel.timeout_s " +
                                     seconds(opt_.timeout_s) + " s + " + seconds(grace_s_) +
                                     " s grace): a collective or store call never returned";
  const std::string line = what + (last.empty() ? "" : " (last collective issued: " + last + ")") +
                           "; heartbeats: " + peers + "; aborting the communicators and exiting with code " +
                           std::to_string(kWatchdogExitCode) + "\n";
  write_all(STDERR_FILENO, line);
  // Progress lines still buffered; skipped when the main thread holds stdout.
  if (ftrylockfile(stdout) == 0) {
    fflush_unlocked(stdout);
    funlockfile(stdout);
  }
  if (opt_.abort) {
    // ncclCommAbort can itself wait on the network: give it a few seconds.
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> f = done->get_future();
    std::thread([fn = opt_.abort, done] {
      try {
        fn();
      } catch (...) {
      }
      done->set_value();
    }).detach();
    f.wait_for(std::chrono::seconds(5));
  }
  ::_exit(kWatchdogExitCode);
}

void Watchdog::post_failure_note() {
  with_store([&](StoreClient& c) { c.set(failed_key(opt_.rank), where()); }, nullptr, false);
}

void Watchdog::linger_for_peers(double max_s) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(max_s);
  std::vector<std::string> keys;
  for (int r = 0; r < opt_.world; ++r) keys.push_back(failed_key(r));
  while (Clock::now() < deadline) {
    bool settled = true;
    const bool ok = with_store([&](StoreClient& c) {
      const std::vector<StoreEntry> notes = c.multi_get(keys);
      const std::vector<Heartbeat> hb = c.read_heartbeats(opt_.world);
      for (int r = 0; r < opt_.world; ++r) {
        if (r == opt_.rank || notes[size_t(r)].present) continue;
        // Stopped, dead or never started: it will not come to ask.
        if (!hb[size_t(r)].present || hb[size_t(r)].age_s > stale_after_s_) continue;
        settled = false;
      }
    }, nullptr, false);
    if (ok && settled) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

void Watchdog::rethrow_failure() {
  const std::exception_ptr ep = std::current_exception();
  if (!ep) throw std::logic_error("Watchdog::rethrow_failure called outside a catch block");
  // Reporting takes a few seconds at most: the timer must not fire meanwhile.
  if (last_progress_ns_.load() != 0) progress(step_.load(), phase_.load());
  std::string what;
  bool distributed = false;
  try {
    std::rethrow_exception(ep);
  } catch (const DistributedFailure&) {
    throw;
  } catch (const CollectiveTimeout& e) {
    what = e.what();
    distributed = true;
  } catch (const StoreError& e) {
    what = e.what();
    distributed = true;
  } catch (const std::runtime_error& e) {
    // Every communicator error names its group as "<op> on group <name>".
    what = e.what();
    distributed = what.find(" on group ") != std::string::npos;
  } catch (...) {
  }
  const std::string at = where();
  const std::string peers = distributed ? describe_peers() : "";
  post_failure_note();
  if (opt_.rank == 0) linger_for_peers(collective_failure_grace_s(opt_.timeout_s) + 1.0);
  if (distributed) throw DistributedFailure(at + ": " + what + "; heartbeats: " + peers);
  std::rethrow_exception(ep);
}

}  // namespace trainer
