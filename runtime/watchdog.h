// The watchdog of a multi-process run (docs/ARCHITECTURE.md "Distributed runs"): a collective that
// does not finish within parallel.timeout_s must end the run on every rank
// with a message naming the collective, the group, the step and the ranks that
// did not arrive, and a non-zero exit so that torchrun's restarts take over.
//
// Two paths lead there:
//
//  * The collective fails by itself (Gloo's own timeout; CollectiveTimeout or
//    a runtime_error "<op> on group <group> ..." naming the missing ranks).
//    The engine catches it around the training loop and calls
//    rethrow_failure(), which adds "step N (phase)" and the heartbeat summary
//    and throws DistributedFailure; main() prints "error: <message>" and exits
//    with kDistributedFailureExitCode.
//
//  * Nothing comes back (NCCL waits on the device forever, a store call hangs
//    because rank 0 is stopped, ...): the watchdog's thread sees no progress()
//    for timeout_s + grace, prints one line to stderr naming this rank, the
//    step, the phase and the stale ranks, aborts the communicators and calls
//    _exit(kDistributedFailureExitCode). The grace lets the first path, which
//    names the collective precisely, win whenever it can.
//
//  * A peer is dead and this rank is blocked: a collective whose transport
//    never notices the peer's end (a Gloo send that waits on a socket the
//    kernel has not reset) would otherwise wait the whole timeout_s, deaf to
//    SIGTERM. While this rank has made no progress for a heartbeat's
//    staleness, the heartbeat thread also reads the others' heartbeats; a
//    peer silent for dead_after_s() (10 s, at least the staleness), or for
//    the staleness alone once a stop was requested (set_stop_requested:
//    SIGTERM, SIGINT), fires the watchdog at once, naming that rank, when
//    that comes before timeout_s (otherwise the collective's own timeout,
//    which names it precisely, ends the wait first).
//
// Heartbeats: the thread publishes Store::set_heartbeat(rank, step) every
// min(1 s, timeout_s / 4) from its OWN store connection (the shared one may be
// held by a waiting call), whether or not the main thread is stuck: a stuck
// rank still heartbeats (at the step it is stuck in), a stopped or dead one
// does not. A peer is "stale" when its heartbeat is older than three
// intervals (at least 1 s), "behind" when it is at an earlier step.
//
//   Watchdog wd({host, port, token, rank, world, timeout_s, abort_all});
//   wd.progress(step, "forward/backward");   // cheap; at each phase boundary
//   ...
//   catch (...) { wd.rethrow_failure(); }       // inside a catch block only
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace trainer {

class StoreClient;
struct Heartbeat;
class ProcessGroups;

// The exit code of a run that ended because a collective timed out or a rank
// went missing (both paths above). 1 is any other run-time failure and 2 a
// configuration mistake (app/main.cpp).
inline constexpr int kDistributedFailureExitCode = 3;
inline constexpr int kWatchdogExitCode = kDistributedFailureExitCode;

// A collective or store failure of a multi-process run, with the step, the
// phase and the heartbeat summary in the message.
class DistributedFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WatchdogOptions {
  std::string host;  // the rendezvous store (ProcessGroups::store().host()/port())
  int port = 0;
  std::string token;  // "" : job_token_from_env()
  int rank = 0;
  int world = 1;
  double timeout_s = 600;  // parallel.timeout_s
  // Makes pending collectives fail instead of hanging (abort_communicators).
  // Called from the watchdog's thread just before it exits the process.
  std::function<void()> abort;
  // Extra seconds past timeout_s before the thread fires; < 0: the default,
  // default_watchdog_grace_s(timeout_s).
  double grace_s = -1;
  // The store's secret; unset: store_secret_from_env() (comm/store_secret.h).
  std::optional<std::string> secret;
};

// collective_failure_grace_s (how long a failed Gloo collective waits for its
// peers' notes) + 3 s (building the message; rank 0's linger).
double default_watchdog_grace_s(double timeout_s);

// Calls abort() on every communicator of `pg` (world, each axis, host world).
std::function<void()> abort_communicators(ProcessGroups& pg);

class Watchdog {
 public:
  // Connects to the store (a failure is not fatal: the summary then says the
  // store is unreachable) and starts the heartbeat thread. The timer is armed
  // by the first progress() call, so slow set-up before the loop never fires.
  explicit Watchdog(WatchdogOptions options);
  // Stops the threads without firing (at most one heartbeat interval, plus a
  // store request or reconnection already under way).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // This rank reached `phase` of `step` (the 1-based step of the logs).
  // `phase` must outlive the watchdog (a string literal). Lock-free.
  void progress(int64_t step, const char* phase);

  // "step 7 (gradient reduction)"
  std::string where() const;

  // One line about the peers, from the heartbeats in the store:
  //   "rank 2 last at step 6, 5.3 s ago (stale)"
  //   "no rank is stale or behind (4 ranks at steps 7..7)"
  //   "store unreachable (store: cannot connect ...)"
  // Never throws.
  std::string describe_peers();

  // Which of `ranks` are gone, dead or stopped: their heartbeat is stale
  // ("rank 3 on node n1: last heartbeat 4.2 s ago, at step 25"; the node
  // once set_places gave it), "" when all of them
  // beat (or never sent one: not started) or the store cannot be read (it
  // cannot tell). For waits outside collectives that would otherwise only
  // end at timeout_s (the checkpoint group's, checkpoint.h PeerLiveness).
  // Never throws; thread-safe.
  std::string gone_among(const std::vector<int>& ranks);

  // Call inside a catch block, on every rank, for any exception that ends
  // the training loop. Posts this rank's failure note in the store; on rank
  // 0, which serves the store, waits up to collective_failure_grace_s + 1 s
  // until every other rank has posted one or gone stale, so that they can
  // still ask the store who is missing. Then a collective or store failure (CollectiveTimeout,
  // StoreError, or a runtime_error naming "on group") is thrown again as
  // DistributedFailure("step N (phase): <what>; heartbeats: <summary>");
  // anything else is rethrown unchanged.
  [[noreturn]] void rethrow_failure();

  double interval_s() const { return interval_s_; }
  double stale_after_s() const { return stale_after_s_; }
  double dead_after_s() const { return dead_after_s_; }
  // Whether the process was asked to stop (a signal): a dead peer then
  // fires the watchdog as soon as its heartbeat is stale. Set once, before
  // the first progress(); the function must be async-safe to call from
  // another thread (an atomic read).
  void set_stop_requested(bool (*requested)()) { stop_requested_.store(requested); }
  double grace_s() const { return grace_s_; }
  // Every rank's host name (observe/placement_report.h RankPlaces), once
  // known: the summaries then name a node whose ranks are all silent ("node
  // trn-node1 (ranks 2-3) is lost") and, when the store cannot be reached,
  // the node that serves it. Thread-safe.
  void set_places(std::vector<std::string> host_of_rank);

 private:
  using Clock = std::chrono::steady_clock;
  void heartbeat_loop();
  void timer_loop();
  bool wait_stop(double seconds);
  // headline: what happened ("" : no progress for timeout_s + grace).
  [[noreturn]] void fire(double idle_s, const std::string& headline = "");
  // Runs fn on the store client; returns false (and sets *error) when the
  // store cannot be reached. Only the heartbeat thread reconnects a dropped
  // connection (which can take seconds when rank 0 is stopped); the others
  // wait at most a request timeout for the connection and never reconnect,
  // so that firing and the error path stay prompt.
  bool with_store(const std::function<void(StoreClient&)>& fn, std::string* error, bool heartbeat_thread);
  void post_failure_note();
  void linger_for_peers(double max_s);
  std::string summarize(int64_t my_step, std::string* error);
  std::string lost_nodes(const std::vector<Heartbeat>& hb);
  std::string unreachable_store_note();
  std::vector<std::string> places();  // a copy of host_of_rank_ (empty until set_places)
  std::mutex places_mu_;
  std::vector<std::string> host_of_rank_;

  WatchdogOptions opt_;
  double interval_s_ = 1, stale_after_s_ = 3, dead_after_s_ = 10, grace_s_ = 3, request_timeout_s_ = 2;
  // The heartbeat thread's last look at the peers while this rank was
  // blocked: the longest-silent other rank and how long (-1: none looked).
  void look_for_dead_peer();
  std::atomic<int> silent_rank_{-1};
  std::atomic<double> silent_s_{0};
  std::atomic<int64_t> silent_at_ns_{0};  // when it was read (Clock ticks)
  // The peer fire_dead_peer judged silent, and for how long: the summary
  // that follows reads the heartbeats again, and the store's age of that
  // beat can lag the judgement by a tick; it must not call the peer alive.
  std::atomic<int> judged_rank_{-1};
  std::atomic<double> judged_silent_s_{0};
  std::atomic<bool (*)()> stop_requested_{nullptr};
  [[noreturn]] void fire_dead_peer(double idle_s, int rank, double silent_s);

  std::atomic<int64_t> step_{0};
  std::atomic<const char*> phase_{"start-up"};
  std::atomic<int64_t> last_progress_ns_{0};  // Clock ticks since epoch; 0: not armed

  // client_ is held by one caller at a time (store_busy_); others wait on
  // store_cv_, the summaries for a bounded time. A flag and a condition
  // variable, not a std::timed_mutex: try_lock_for locks through
  // pthread_mutex_clocklock, which ThreadSanitizer (gcc 12) does not see,
  // so every unlock read as one of an unlocked mutex.
  std::mutex store_mu_;
  std::condition_variable store_cv_;
  bool store_busy_ = false;
  std::unique_ptr<StoreClient> client_;
  std::mutex error_mu_;
  std::string store_error_;  // why client_ is gone

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread heartbeat_thread_, timer_thread_;
};

}  // namespace trainer
