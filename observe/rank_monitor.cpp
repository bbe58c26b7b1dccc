#include "observe/rank_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "observe/gpu_report.h"

namespace trainer {

namespace {

constexpr int kFields = 20;    // per rank and report: 11 of pace, 9 of the GPU

}  // namespace

RankMonitor::RankMonitor(Communicator& host, const RankPlaces& places, const LogConfig& cfg,
                         const std::string& run_dir, bool append)
    : host_(host),
      threshold_(cfg.straggler_threshold),
      intervals_(cfg.straggler_intervals),
      hosts_(places.host),
      local_ranks_(places.local_rank) {
  const int n = host.size();
  slow_.assign(size_t(n), 0);
  shares_.assign(size_t(n), {});
  if (host.rank() == 0 && !run_dir.empty()) {
    const std::string path = run_dir + "/ranks.jsonl";
    out_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (!out_) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  }
}

RankMonitor::~RankMonitor() {
  if (out_) std::fclose(out_);
}

namespace {

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::string RankMonitor::report(int64_t step, const RankReport& m, const std::vector<double>& held_ms) {
  const int n = host_.size();
  const double mine[kFields] = {m.tokens_per_s, m.step_ms, m.busy_ms(), m.grad_norm, 1e3 * m.time.data,
                                1e3 * m.time.forward, 1e3 * m.time.backward, 1e3 * m.time.optimizer,
                                1e3 * m.time.comm_total(), 1e3 * m.time.checkpoint, 1e3 * m.time.other,
                                m.gpu.read ? 1.0 : 0.0, m.gpu.sm_mhz, m.gpu.sm_max_mhz, m.gpu.temperature_c,
                                m.gpu.power_w, m.gpu.power_limit_w, m.gpu.memory_used_gib, double(m.gpu.throttle),
                                double(m.gpu.ecc_uncorrected)};
  std::vector<double> all(size_t(n) * kFields);
  if (n > 1)
    host_.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(const_cast<double*>(mine), DType::F64, {kFields}));
  else
    std::copy(mine, mine + kFields, all.begin());
  if (host_.rank() != 0) return "";
  auto at = [&](int r, int f) { return all[size_t(r) * kFields + size_t(f)]; };
  std::vector<double> busy, step_ms;
  for (int r = 0; r < n; ++r) busy.push_back(at(r, 2)), step_ms.push_back(at(r, 1));
  const double median_busy = median_of(busy), median_step = median_of(step_ms);
  std::string alerts;
  char buf[640];
  gpus_.assign(size_t(n), GpuHealth{});
  for (int r = 0; r < n; ++r) {
    GpuHealth& g = gpus_[size_t(r)];
    g.read = at(r, 11) > 0;
    g.sm_mhz = at(r, 12);
    g.sm_max_mhz = at(r, 13);
    g.temperature_c = at(r, 14);
    g.power_w = at(r, 15);
    g.power_limit_w = at(r, 16);
    g.memory_used_gib = at(r, 17);
    g.throttle = uint64_t(at(r, 18));
    g.ecc_uncorrected = uint64_t(at(r, 19));
  }
  for (int r = 0; r < n; ++r) {
    const GpuHealth& gpu = gpus_[size_t(r)];
    const double held = size_t(r) < held_ms.size() ? held_ms[size_t(r)] : 0;
    std::deque<double>& recent = shares_[size_t(r)];
    recent.push_back(median_step > 0 ? held / median_step : 0);
    if (int64_t(recent.size()) > intervals_) recent.pop_front();
    double share = 0;
    for (double x : recent) share += x;
    share /= double(recent.size());
    const bool judged = int64_t(recent.size()) == intervals_;
    slow_[size_t(r)] = judged && share > threshold_ ? slow_[size_t(r)] + 1 : 0;
    if (out_) {
      std::fprintf(out_,
                   "{\"step\": %lld, \"rank\": %d, \"host\": \"%s\", \"local_rank\": %d, \"tokens_per_s\": %.6g, "
                   "\"step_ms\": %.6g, \"busy_ms\": %.6g, \"held_others_ms\": %.6g, \"grad_norm_shard\": %.6g, "
                   "\"data_ms\": %.6g, \"forward_ms\": %.6g, \"backward_ms\": %.6g, \"optimizer_ms\": %.6g, "
                   "\"comm_ms\": %.6g, \"checkpoint_ms\": %.6g, \"other_ms\": %.6g, \"slow_intervals\": %lld%s%s}\n",
                   (long long)step, r, hosts_[size_t(r)].c_str(), local_ranks_[size_t(r)], at(r, 0), at(r, 1), at(r, 2),
                   held, at(r, 3), at(r, 4), at(r, 5), at(r, 6), at(r, 7), at(r, 8), at(r, 9), at(r, 10),
                   (long long)slow_[size_t(r)], gpu.read ? ", \"gpu\": " : "", gpu.read ? gpu_json(gpu).c_str() : "");
    }
    if (slow_[size_t(r)] == 1) {  // once per spell: again only after the average fell below
      std::snprintf(buf, sizeof buf,
                    "straggler: rank %d (host %s, local rank %d) kept the other ranks waiting in collectives %.0f%% "
                    "of the step over the last %lld log intervals (now %.1f ms of the %.1f ms step; "
                    "log.straggler_threshold=%g); its busy time %.1f ms, the median %.1f ms\n",
                    r, hosts_[size_t(r)].c_str(), local_ranks_[size_t(r)], 100 * share, (long long)intervals_, held,
                    median_step, threshold_, busy[size_t(r)], median_busy);
      alerts += buf;
      if (gpu_throttled(gpu)) {
        alerts.pop_back();  // the line goes on with the cause
        alerts += "; its GPU: " + gpu_cause(gpu) + "\n";
      }
    }
  }
  if (out_) std::fflush(out_);
  return alerts;
}

}  // namespace trainer
