#include "rank_runner.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <thread>

#include "e2e_util.h"

namespace trainer::test {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::vector<ChildResult> run_ranks(const Run& run, const Body& body) {
  const int port = e2e::free_port();
  std::vector<pid_t> pids(run.world);
  std::vector<int> report_fd(run.world), release_fd(run.world);
  auto listed = [](const std::vector<int>& v, int r) { return std::find(v.begin(), v.end(), r) != v.end(); };
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < run.world; ++r) {
    int rep[2], rel[2];
    REQUIRE(pipe(rep) == 0);
    REQUIRE(pipe(rel) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(rep[0]);
      close(rel[1]);
      for (int q = 0; q < r; ++q) {  // the parent's ends for earlier children
        close(report_fd[q]);
        close(release_fd[q]);
      }
      std::string report, note;
      int code = 0;
      std::unique_ptr<ProcessGroups> pg;
      try {
        if (listed(run.absent, r)) {
          std::this_thread::sleep_for(std::chrono::seconds(60));
        } else {
          LaunchInfo li;
          li.launcher = "test";
          li.rank = r;
          li.world_size = run.world;
          li.local_rank = r;
          li.local_world_size = run.world;
          li.master_addr = "127.0.0.1";
          li.master_port = port;
          ProcessGroupOptions o;
          o.timeout_s = run.timeout_s;
          o.token = "test-comm";
          o.host_staged = run.host_staged;
          pg = std::make_unique<ProcessGroups>(li, run.mesh, Device::CPU, o);
          body(*pg, note);
        }
      } catch (const std::exception& e) {
        report = std::string("rank ") + std::to_string(r) + " failed: " + e.what();
        code = 1;
      }
      const std::string msg = report + "\n" + note;
      ssize_t off = 0;
      while (off < ssize_t(msg.size())) {
        const ssize_t w = write(rep[1], msg.data() + off, msg.size() - off);
        if (w <= 0) break;
        off += w;
      }
      close(rep[1]);
      char c;
      while (read(rel[0], &c, 1) > 0) {
      }
      pg.reset();
      _exit(code);
    }
    close(rep[1]);
    close(rel[0]);
    pids[r] = pid;
    report_fd[r] = rep[0];
    release_fd[r] = rel[1];
  }

  std::vector<ChildResult> results(run.world);
  std::vector<std::string> text(run.world);
  std::vector<bool> open(run.world, true);
  const auto start = Clock::now();
  auto waiting = [&] {
    for (int r = 0; r < run.world; ++r)
      if (open[r] && !listed(run.silent, r) && !listed(run.absent, r)) return true;
    return false;
  };
  while (waiting() && seconds_since(start) < run.deadline_s) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int r = 0; r < run.world; ++r)
      if (open[r]) {
        fds.push_back({report_fd[r], POLLIN, 0});
        who.push_back(r);
      }
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      const int r = who[i];
      if (n > 0) {
        text[r].append(buf, size_t(n));
      } else {
        open[r] = false;
        results[r].reported = true;
      }
    }
  }
  for (int r = 0; r < run.world; ++r) {
    if (listed(run.silent, r) || listed(run.absent, r) || !results[r].reported) kill(pids[r], SIGKILL);
    close(report_fd[r]);
    close(release_fd[r]);
  }
  for (int r = 0; r < run.world; ++r) {
    results[r].rank = r;
    const size_t nl = text[r].find('\n');
    results[r].report = text[r].substr(0, nl);
    if (nl != std::string::npos) text[r] = text[r].substr(nl + 1);
    int status = 0;
    // The released children exit at once; give them a moment, then insist.
    const auto t0 = Clock::now();
    pid_t got = 0;
    while ((got = waitpid(pids[r], &status, WNOHANG)) == 0 && seconds_since(t0) < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (got == 0) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
    }
    results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
    if (results[r].reported) results[r].report += text[r].empty() ? "" : "\n  note: " + text[r];
  }
  return results;
}

void require_all_passed(const std::vector<ChildResult>& results) {
  for (const ChildResult& c : results) {
    INFO("rank " << c.rank << ": " << (c.reported ? c.report : "no report (hung?)"));
    CHECK(c.reported);
    CHECK(c.exit_code == 0);
  }
}

}  // namespace trainer::test
