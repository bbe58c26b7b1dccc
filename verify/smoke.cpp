#include "verify/smoke.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "planner/memory_plan.h"
#include "verify/smoke_roundtrip.h"

namespace trainer {

namespace {

double mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return to > from ? s / double(to - from) : NAN;
}

// The 25th percentile: the pace the run keeps when nothing else interferes.
// Other processes on a shared machine inflate single steps; a real slowdown
// (a slow rank, memory pressure, throttling) moves the whole distribution.
double lower_quartile(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 4), v.end());
  return v[v.size() / 4];
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

size_t host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? size_t(pages) * size_t(page) : 0;
}

}  // namespace

std::vector<SmokeCheck> judge_smoke(const TrainSummary& s, size_t device_bytes) {
  std::vector<SmokeCheck> out;
  {
    SmokeCheck c{"memory plan fits the device", false, ""};
    c.pass = device_bytes == 0 || within_usable_memory(double(s.planned_bytes), double(device_bytes));
    c.detail = "plan " + format_bytes(double(s.planned_bytes)) + " of " +
               (device_bytes ? format_bytes(double(device_bytes)) : std::string("unknown")) + " (limit " +
               std::to_string(int(100 * kUsableMemoryShare + 0.5)) + "%)";
    out.push_back(c);
  }
  {
    SmokeCheck c{"no NaN/Inf in loss or gradients", !s.diverged, ""};
    for (double v : s.losses) c.pass = c.pass && std::isfinite(v);
    for (double v : s.grad_norms) c.pass = c.pass && std::isfinite(v);
    c.detail = s.diverged ? s.divergence : std::to_string(s.losses.size()) + " steps finite";
    out.push_back(c);
  }
  {
    SmokeCheck c{"loss falling", false, ""};
    const size_t n = s.losses.size();
    if (n < 10) {
      c.detail = "only " + std::to_string(n) + " steps ran (need 10)";
    } else {
      const size_t w = std::max<size_t>(1, n / 10);
      const double first = s.losses[0];
      const double a = mean(s.losses, 0, w), b = mean(s.losses, n - w, n);
      const double peak = *std::max_element(s.losses.begin(), s.losses.end());
      // The end must be below both the start window and the loss at step 1
      // (the untrained model), and no step may blow up to twice the start: a
      // run that explodes and then recovers part of the way is not healthy.
      c.pass = std::isfinite(a) && std::isfinite(b) && b < 0.99 * a && b < first && peak < 2 * first;
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "step 1 %.4f, mean of first %zu steps %.4f -> last %zu steps %.4f, peak %.4f", first,
                    w, a, w, b, peak);
      c.detail = buf;
    }
    out.push_back(c);
  }
  {
    SmokeCheck c{"throughput stable", false, ""};
    const size_t n = s.step_ms.size();
    const size_t skip = std::min<size_t>(5, n / 10);  // start-up steps warm caches and threads
    if (n - skip < 4) {
      c.detail = "too few steps timed";
    } else {
      const size_t mid = skip + (n - skip) / 2;
      const double a = lower_quartile({s.step_ms.begin() + long(skip), s.step_ms.begin() + long(mid)});
      const double b = lower_quartile({s.step_ms.begin() + long(mid), s.step_ms.end()});
      const double r = b / a;
      // Steps of a few ms (a tiny model) move by whole factors when the OS
      // runs something else for a moment (a checkpoint's writeback on a
      // 2-core machine): a change under kJitterMs a step is not a trend.
      constexpr double kJitterMs = 5.0;
      c.pass = (r > 0.67 && r < 1.5) || std::abs(b - a) < kJitterMs;
      c.detail = fmt("step time (25th percentile) %.1f ms in the first half vs %.1f ms in the second, ratio %.2f", a, b, r) +
                 fmt(" (allowed 0.67-1.5, or a change under %.0f ms)", kJitterMs);
    }
    out.push_back(c);
  }
  {
    SmokeCheck c{"checkpoint save -> load round trip", s.roundtrip_checked && s.roundtrip_ok,
                 s.roundtrip_checked ? s.roundtrip_detail : "not run (the run diverged)"};
    out.push_back(c);
  }
  return out;
}

std::string format_verdict(const std::vector<SmokeCheck>& checks) {
  std::string t = "\nsmoke test verdict\n";
  int failed = 0;
  for (const auto& c : checks) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "  %s  %-36s ", c.pass ? "PASS" : "FAIL", c.name.c_str());
    t += buf + c.detail + "\n";
    failed += !c.pass;
  }
  t += failed ? "smoke test FAILED: " + std::to_string(failed) + " of " + std::to_string(checks.size()) +
                    " checks failed; fix the configuration before the real run\n"
              : "smoke test PASSED: all " + std::to_string(checks.size()) + " checks passed\n";
  return t;
}

int run_smoke_test(Config cfg, int64_t steps, const LaunchInfo& launch) {
  const bool several = launch.launched();
  const bool lead = launch.rank == 0;
  std::string tmp;
  if (several) {
    // Rank 0 clears it before the others can pass the start-up barrier.
    tmp = cfg.run_dir() + "/smoke-test";
    std::error_code ec;
    if (lead) std::filesystem::remove_all(tmp, ec);
    if (ec) throw std::runtime_error("smoke test: cannot clear " + tmp + ": " + ec.message());
  } else {
    char tmpl[] = "/tmp/trainer-smoke-XXXXXX";
    if (!::mkdtemp(tmpl)) throw std::runtime_error("smoke test: cannot create a temporary directory in /tmp");
    tmp = tmpl;
  }
  cfg.run.dir = tmp + "/run";
  cfg.checkpoint.dir = tmp + "/ckpt";
  cfg.checkpoint.resume = "none";
  const int64_t n = std::min(steps, cfg.train.steps);
  cfg.checkpoint.interval = std::max<int64_t>(1, n / 2);
  cfg.checkpoint.keep_last = 2;
  if (lead)
    std::printf("smoke test: %lld steps of %s%s, checkpoints in %s\n", (long long)n, cfg.source.c_str(),
                several ? (" on " + std::to_string(launch.world_size) + " ranks").c_str() : "", tmp.c_str());
  RunOptions opt;
  opt.smoke = true;
  opt.after_run = check_roundtrip;
  opt.stop_after = n;
  opt.launch = launch;
  const TrainSummary s = run_training(cfg, opt);
  const auto checks = judge_smoke(s, s.device_bytes > 0 ? s.device_bytes : host_memory_bytes());
  const bool ok = std::all_of(checks.begin(), checks.end(), [](const SmokeCheck& c) { return c.pass; });
  if (!lead) return ok ? 0 : 1;
  std::fputs(format_verdict(checks).c_str(), stdout);
  if (ok) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
  } else {
    std::printf("smoke test files kept for inspection in %s\n", tmp.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace trainer
