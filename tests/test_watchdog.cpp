// The watchdog (runtime/watchdog.h): the heartbeat summary and the error path
// in-process against a real store server; the timer firing in a forked child
// (firing ends the process with _exit); and end to end, four CPU ranks of the
// real binary where one is stopped with SIGSTOP mid-run: every other rank must
// exit with kDistributedFailureExitCode within parallel.timeout_s + 6 s, with a
// message naming the collective, the group, the step and the missing rank.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <atomic>

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"
#include "runtime/watchdog.h"

namespace fs = std::filesystem;
using namespace trainer;
using Clock = std::chrono::steady_clock;

namespace {

const char* const kHost = "127.0.0.1";
const char* const kToken = "watchdog-test-token";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

StoreServerOptions quiet() {
  StoreServerOptions o;
  o.log = [](const std::string&) {};
  return o;
}

WatchdogOptions options(int port, int rank, int world, double timeout_s) {
  WatchdogOptions o;
  o.host = kHost;
  o.port = port;
  o.token = kToken;
  o.rank = rank;
  o.world = world;
  o.timeout_s = timeout_s;
  return o;
}

// What rethrow_failure makes of `thrown` (it must be called in a catch block).
template <class E>
std::string rethrown(Watchdog& w, const E& thrown, bool* distributed) {
  try {
    try {
      throw thrown;
    } catch (...) {
      w.rethrow_failure();
    }
  } catch (const DistributedFailure& e) {
    *distributed = true;
    return e.what();
  } catch (const std::exception& e) {
    *distributed = false;
    return e.what();
  }
  return "";
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Child processes that are SIGKILLed and reaped however the test ends.
struct Children {
  std::vector<pid_t> pids;
  ~Children() {
    for (pid_t p : pids)
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
      }
  }
};

}  // namespace

TEST_CASE("watchdog: heartbeat summary, error path, and a store that went away", "[watchdog]") {
  auto server = std::make_unique<StoreServer>(kHost, 0, kToken, quiet());
  const int port = server->port();
  StoreClient peer(kHost, port, kToken, 10);
  peer.set_heartbeat(0, 7);
  peer.set_heartbeat(2, 5);  // rank 3 never sends one
  {
    Watchdog w(options(port, 1, 4, 4.0));
    CHECK(w.interval_s() == 1.0);
    CHECK(w.stale_after_s() == 3.0);
    CHECK(w.grace_s() == default_watchdog_grace_s(4.0));
    w.progress(7, "optimizer step");
    CHECK(w.where() == "step 7 (optimizer step)");
    const std::string peers = w.describe_peers();
    INFO(peers);
    CHECK(contains(peers, "rank 2 at step 5 (behind"));
    CHECK(contains(peers, "rank 3 sent no heartbeat"));
    CHECK_FALSE(contains(peers, "rank 0"));  // alive at our step

    // A collective failure gains the step, the phase and the heartbeats ...
    bool distributed = false;
    std::string msg = rethrown(
        w, CollectiveTimeout("all_reduce on group dp (ranks 0,1,2,3) timed out after 4 s: rank 3 never joined it"),
        &distributed);
    CHECK(distributed);
    CHECK(contains(msg, "step 7 (optimizer step): all_reduce on group dp (ranks 0,1,2,3) timed out"));
    CHECK(contains(msg, "; heartbeats: "));
    CHECK(contains(msg, "rank 3 sent no heartbeat"));
    CHECK(peer.check({"watchdog/failed/1"}));
    // ... as does any error that names a group; others pass unchanged.
    msg = rethrown(w, std::runtime_error("all_gather on group dp (ranks 0,1,2,3) failed: connection closed"),
                   &distributed);
    CHECK(distributed);
    msg = rethrown(w, std::runtime_error("data: cannot read tokens.bin"), &distributed);
    CHECK_FALSE(distributed);
    CHECK(msg == "data: cannot read tokens.bin");

    // Rank 0 serves the store: it waits for the live peers to post their
    // failure, and not longer (rank 2 and 3 are stale or silent here).
    peer.set_heartbeat(1, 7);  // rank 1 (`w`) keeps heartbeating
    peer.del("heartbeat/2");   // ranks 2 and 3: never started
    peer.del("watchdog/failed/1");
    Watchdog w0(options(port, 0, 4, 2.0));
    w0.progress(7, "gradient reduction");
    auto t = Clock::now();
    rethrown(w0, CollectiveTimeout("x on group dp"), &distributed);
    const double lingered = since(t);  // rank 1 is alive and has not failed
    peer.set("watchdog/failed/1", "step 7");
    t = Clock::now();
    rethrown(w0, CollectiveTimeout("x on group dp"), &distributed);
    const double prompt = since(t);
    std::printf("[watchdog] rank 0 lingered %.2f s for a live peer (max %.1f), %.2f s once it reported\n", lingered,
                std::min(2.0 / 2, 3.0) + 1, prompt);
    CHECK(lingered > 1.5);
    CHECK(lingered < 4.0);
    CHECK(prompt < 1.0);

    // The store goes away (rank 0 exited): no crash, and the summary says so.
    server.reset();
    const std::string gone = w.describe_peers();
    INFO(gone);
    CHECK(contains(gone, "store unreachable"));
    msg = rethrown(w, CollectiveTimeout("broadcast on group dp (ranks 0,1,2,3) timed out"), &distributed);
    CHECK(distributed);
    CHECK(contains(msg, "heartbeats: store unreachable"));
  }  // the destructors stop the threads with the store gone
}

namespace {

bool stop_was_requested() { return true; }

struct Fired {
  std::string err;
  double elapsed = 0;
  int status = 0;
  bool exited = false;
};

// A forked rank 0 of 2 whose main thread reports step 3 and then blocks
// ("stuck in a collective"); its watchdog's stderr and exit, within
// `window` seconds. `peer_alive`: a thread of this process keeps rank 1's
// heartbeat fresh meanwhile; otherwise rank 1 beat once and went silent.
// `hosts`: every rank's host for Watchdog::set_places (empty: not given).
Fired block_rank0(double timeout, double grace, double window, bool peer_alive, bool stop_requested,
                  const std::vector<std::string>& hosts = {}) {
  StoreServer server(kHost, 0, kToken, quiet());
  const int port = server.port();
  std::atomic<bool> done{false};
  std::thread peer([&] {
    StoreClient c(kHost, port, kToken, 10);
    c.set_heartbeat(1, 2);
    while (peer_alive && !done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      c.set_heartbeat(1, 2);
    }
  });
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  std::fflush(stdout);  // the child flushes stdout when it fires: not our lines twice
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    WatchdogOptions o = options(port, 0, 2, timeout);
    o.grace_s = grace;
    o.abort = [] { (void)!::write(STDERR_FILENO, "abort callback ran\n", 19); };
    Watchdog w(o);
    if (stop_requested) w.set_stop_requested(&stop_was_requested);
    if (!hosts.empty()) w.set_places(hosts);
    w.progress(3, "gradient reduction");
    std::this_thread::sleep_for(std::chrono::seconds(int(window) + 10));  // "stuck in a collective"
    ::_exit(99);
  }
  Children guard{{pid}};
  ::close(fds[1]);
  Fired f;
  char buf[4096];
  for (;;) {  // the child's stderr until it exits (EOF), within a bounded window
    const double left = window + 2.0 - since(t0);
    if (left <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, int(left * 1000) + 1) <= 0) break;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    f.err.append(buf, size_t(n));
  }
  ::close(fds[0]);
  pid_t reaped = 0;
  while ((reaped = ::waitpid(pid, &f.status, WNOHANG)) == 0 && since(t0) < window + 2.0)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  f.elapsed = since(t0);
  f.exited = reaped == pid && WIFEXITED(f.status);
  if (reaped == pid) guard.pids.clear();
  done = true;
  peer.join();
  return f;
}

}  // namespace

TEST_CASE("watchdog: no progress for timeout + grace fires and names the peers", "[watchdog][serial]") {
  // The peer is alive (heartbeats), so only the timeout can end the wait.
  const double timeout = 1.0, grace = 1.0, window = timeout + grace + 1.0;
  const Fired f = block_rank0(timeout, grace, window, true, false);
  std::printf("[watchdog] fired after %.2f s (timeout %.1f + grace %.1f, window %.1f s)\n", f.elapsed, timeout, grace,
              window);
  INFO(f.err);
  REQUIRE(f.exited);
  CHECK(WEXITSTATUS(f.status) == kWatchdogExitCode);
  CHECK(f.elapsed >= timeout + grace - 0.05);
  CHECK(f.elapsed <= window);
  CHECK(contains(f.err, "watchdog: rank 0 made no progress for"));
  CHECK(contains(f.err, "at step 3 (gradient reduction)"));
  CHECK(contains(f.err, "rank 1 at step 2 (behind, alive"));
  CHECK(contains(f.err, "exiting with code 3"));
  CHECK(contains(f.err, "abort callback ran"));
}

TEST_CASE("watchdog: blocked on a dead peer fires after its heartbeat is 10 s old, 3 s once a stop was asked",
          "[watchdog][serial]") {
  // timeout_s 60: without the heartbeats the wait would last a minute, and a
  // transport that never notices the peer's end (a Gloo send to a killed
  // rank, seen under torchrun) keeps it deaf to SIGTERM all that time.
  const double timeout = 60, grace = 1;
  for (const bool stop : {true, false}) {
    INFO("stop requested " << stop);
    const double least = stop ? 3.0 : 10.0, window = least + 4.0;
    const Fired f = block_rank0(timeout, grace, window, false, stop);
    std::printf("[watchdog] rank 1 silent, %s: fired after %.2f s (heartbeat stale after 3 s, dead after 10 s, "
                "timeout 60 s)\n", stop ? "a stop requested" : "no stop requested", f.elapsed);
    INFO(f.err);
    REQUIRE(f.exited);
    CHECK(WEXITSTATUS(f.status) == kWatchdogExitCode);
    CHECK(f.elapsed >= least - 0.05);
    CHECK(f.elapsed <= window);
    CHECK(contains(f.err, "watchdog: rank 0 has been blocked for"));
    CHECK(contains(f.err, "at step 3 (gradient reduction) while rank 1 sent no heartbeat for"));
    CHECK(contains(f.err, stop ? "a stop was requested" : "(dead or stopped)"));
    CHECK(contains(f.err, "abort callback ran"));
  }
}

TEST_CASE("watchdog: a node whose every rank is silent is named", "[watchdog][serial]") {
  // Rank 1 alone on host nodeB: its silence is that node's loss (the cut
  // link of the multinode test, where a real second host is not at hand).
  const Fired f = block_rank0(60, 1, 7.0, false, true, {"nodeA", "nodeB"});
  std::printf("[watchdog] rank 1's node silent: fired after %.2f s\n", f.elapsed);
  INFO(f.err);
  REQUIRE(f.exited);
  CHECK(contains(f.err, "heartbeats: node nodeB (rank 1) is lost: none of its ranks has sent a heartbeat for"));
  CHECK(contains(f.err, "(the host, or its network link, is down)"));
}

namespace {

// stop_one_rank's run in dir: its tokens (the GPL's bytes) and its config.
// Returns the config's path.
std::string write_watchdog_run(const fs::path& dir, double timeout, int tp, int pp) {
  {
    std::vector<uint16_t> toks;
    const std::string text = read_file("/usr/share/common-licenses/GPL-3");
    for (unsigned char c : text) toks.push_back(c);
    std::ofstream(dir / "tokens.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  }
  const std::string cfg = (dir / "cfg.yaml").string();
  // Milliseconds a step: 100000 steps would run for many minutes.
  std::ofstream(cfg) << "run: {name: watchdog}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}\n"
                     << "train: {steps: 100000, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, threads: 1}\n"
                     << "optim: {lr: 3.0e-3, warmup_steps: 3}\n"
                     << "data: {train: [" << (dir / "tokens.bin").string() << "]}\n"
                     << "checkpoint: {interval: 0}\n"
                     << "log: {interval: 1, progress: lines, jsonl: false}\n"
                     << "parallel: {timeout_s: " << timeout << ", tp: " << tp << ", pp: " << pp << "}\n";
  return cfg;
}

// `world` trainer processes on cfg under torchrun's variables (the store on
// `port`), each logging to dir/rank<r>.log; their pids go to kids.
void launch_ranks(Children& kids, int world, const std::string& cfg, const fs::path& dir, int port,
                  const std::string& token) {
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
    const std::string rs = std::to_string(r), ws = std::to_string(world);
    for (const std::string& v :
         {"RANK=" + rs, "WORLD_SIZE=" + ws, "LOCAL_RANK=" + rs, "LOCAL_WORLD_SIZE=" + ws,
          std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port - 1),
          "TRAINER_JOB_TOKEN=" + token})
      env.push_back(v);
    std::vector<std::string> args = {TRAINER_BIN, "--config", cfg, "--set",
                                     "run.dir=" + (dir / "run").string()};
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string log = (dir / ("rank" + rs + ".log")).string();
    std::fflush(stdout);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    kids.pids.push_back(pid);
  }
}

// The victim's step once its own heartbeat says it is past step 5; 0 when it
// did not get there in 90 s or a rank died before (its log says why).
int64_t wait_past_step_5(Children& kids, int world, int victim, int port, const std::string& token) {
  int64_t victim_step = 0;
  {
    StoreClient store(kHost, port, token, 60);
    const auto start = Clock::now();
    while (since(start) < 90) {
      const auto hb = store.read_heartbeats(world);
      if (hb[victim].present && hb[victim].step > 5) {
        victim_step = hb[victim].step;
        break;
      }
      bool early = false;  // a rank that died before the stop: its log says why
      for (pid_t& p : kids.pids)
        if (::waitpid(p, nullptr, WNOHANG) == p) p = 0, early = true;
      if (early) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return victim_step;
}

// Waits until every rank but the victim has exited, or window + 20 s after
// `stopped`: per rank the delay after `stopped` and the exit code (-1: still
// running).
void wait_for_exits(Children& kids, int world, int victim, double window, Clock::time_point stopped,
                    std::vector<double>& delay, std::vector<int>& code) {
  for (;;) {
    bool all = true;
    for (int r = 0; r < world; ++r) {
      if (r == victim || delay[r] >= 0) continue;
      int st = 0;
      if (::waitpid(kids.pids[r], &st, WNOHANG) == kids.pids[r]) {
        delay[r] = since(stopped);
        code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        kids.pids[r] = 0;
      } else {
        all = false;
      }
    }
    if (all || since(stopped) > window + 20) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Every rank but the victim exited in time with kDistributedFailureExitCode,
// its last error line naming the collective, the group, the step and the
// stopped rank. Counts the ranks that named a tp collective and a pipeline
// transfer.
void check_exit_lines(const fs::path& dir, int world, int victim, int tp, int pp, double window,
                      const std::vector<double>& delay, const std::vector<int>& code, int& named_tp,
                      int& named_pp) {
  for (int r = 0; r < world; ++r) {
    if (r == victim) continue;
    const std::string out = read_file(dir / ("rank" + std::to_string(r) + ".log"));
    // The last line that starts with "error: " (main) or "watchdog: " (the thread).
    std::string line = "(no error line)";
    std::istringstream lines(out);
    for (std::string l; std::getline(lines, l);)
      if (l.rfind("error: ", 0) == 0 || l.rfind("watchdog: ", 0) == 0) line = l;
    std::printf("[watchdog] rank %d exited with code %d after %.2f s: %s\n", r, code[r], delay[r], line.c_str());
    INFO("rank " << r << " log:\n" << out);
    CHECK(delay[r] >= 0);
    CHECK(delay[r] <= window);
    CHECK(code[r] == kDistributedFailureExitCode);
    // The collective, the group and the step.
    CHECK((contains(line, "all_reduce") || contains(line, "reduce_scatter") || contains(line, "all_gather") ||
           (pp > 1 && contains(line, "batch_send_recv"))));
    CHECK((contains(line, " on group dp") || contains(line, " on group world") ||
           (tp > 1 && contains(line, " on group tp")) || (pp > 1 && contains(line, " on group pp"))));
    named_tp += contains(line, " on group tp");
    // A stuck pipeline transfer names the stage group and the peer.
    if (contains(line, "batch_send_recv")) {
      CHECK(contains(line, "batch_send_recv on group pp"));
      named_pp += 1;
    }
    CHECK(contains(line, "step "));
    if (victim == 0) {
      // The store went silent with rank 0: the watchdog line names the last
      // collective and says that the heartbeats cannot be read.
      CHECK(contains(line, "watchdog: rank "));
      CHECK(contains(line, "last collective issued: "));
      CHECK(contains(line, "store unreachable"));
    } else {
      // Which ranks a collective's members saw depends on where the ring
      // broke (a neighbour of the stopped rank may have finished); the
      // heartbeats name the one that stopped.
      CHECK(contains(line, "error: step "));
      // A collective names who never joined; a transfer names its peer.
      if (contains(line, "batch_send_recv"))
        CHECK((contains(line, " to rank ") || contains(line, " from rank ")));
      else
        CHECK(contains(line, "never joined it"));
      // Another rank may be listed first (one step behind, still alive).
      CHECK(contains(line, "heartbeats: rank "));
      CHECK(contains(line, "rank " + std::to_string(victim) + " last at step "));
      CHECK(contains(line, "(stale)"));
    }
  }
}

// Four ranks train (dp 4, or tp 2 x dp 2); `victim` is stopped with SIGSTOP
// past step 5; every other rank must exit with kDistributedFailureExitCode in
// time, saying why.
void stop_one_rank(int victim, int tp = 1, int pp = 1) {
  const fs::path dir = fs::temp_directory_path() / ("trainer_watchdog_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const double timeout = 4;
  const int world = 4;
  const std::string cfg = write_watchdog_run(dir, timeout, tp, pp);
  const int port = free_port();  // the store: MASTER_PORT + 1 under torchrun's variables
  const std::string token = "watchdog-e2e-" + std::to_string(::getpid());

  Children kids;
  launch_ranks(kids, world, cfg, dir, port, token);

  // Rank 2's own heartbeat says when it is past step 5.
  const int64_t victim_step = wait_past_step_5(kids, world, victim, port, token);
  if (victim_step <= 5)
    for (int r = 0; r < world; ++r) UNSCOPED_INFO("rank " << r << " log:\n" << read_file(dir / ("rank" + std::to_string(r) + ".log")));
  REQUIRE(victim_step > 5);
  REQUIRE(::kill(kids.pids[victim], SIGSTOP) == 0);
  const auto stopped = Clock::now();

  // Every other rank must exit, non-zero, within timeout + 6 s. Stopping
  // rank 0 also freezes the store, so nobody can ask who is missing: the
  // watchdog thread ends those ranks at timeout + grace.
  const double window = victim == 0 ? timeout + default_watchdog_grace_s(timeout) + 3 : timeout + 6;
  std::vector<double> delay(world, -1);
  std::vector<int> code(world, -1);
  wait_for_exits(kids, world, victim, window, stopped, delay, code);
  ::kill(kids.pids[victim], SIGKILL);
  ::waitpid(kids.pids[victim], nullptr, 0);
  kids.pids[victim] = 0;

  std::printf("[watchdog] tp %d: SIGSTOP rank %d at its step %lld; parallel.timeout_s %.0f, window %.1f s\n", tp,
              victim, (long long)victim_step, timeout, window);
  int named_tp = 0, named_pp = 0;
  check_exit_lines(dir, world, victim, tp, pp, window, delay, code, named_tp, named_pp);
  // The stopped rank's tensor-parallel peer usually waits on it inside the
  // model (most collectives of a step are tp ones); when the victim stopped
  // between the model and the step's norm all-reduce, everyone waits in
  // that collective instead, named as checked above. The naming of a group
  // that times out is checked deterministically in tests/test_comm.cpp.
  if (tp > 1) std::printf("[watchdog] tp: %d of %d ranks were waiting in a tp collective\n", named_tp, world - 1);
  // Under pp the stopped stage's neighbours usually wait in a transfer
  // (named with its peer, checked above); when the victim stopped between
  // its last transfer and the step's norm all-reduce they wait in that
  // collective instead, which names the stale rank as checked above.
  if (pp > 1) std::printf("[watchdog] pp: %d of %d ranks were waiting in a pipeline transfer\n", named_pp, world - 1);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("watchdog: a rank stopped with SIGSTOP ends the run on every other rank", "[watchdog][e2e][serial]") {
  stop_one_rank(2);
}

TEST_CASE("watchdog: stopping rank 0, which serves the store, still ends every other rank", "[watchdog][e2e][serial]") {
  stop_one_rank(0);
}

TEST_CASE("watchdog: under tp 2 x dp 2 a stopped rank's peers name the tensor-parallel collective",
          "[watchdog][tp][e2e][serial]") {
  stop_one_rank(1, 2);
}

TEST_CASE("watchdog: under pp 2 x dp 2 the stopped stage's neighbour names the transfer and the peer",
          "[watchdog][pp][e2e][serial]") {
  stop_one_rank(2, 1, 2);
}
