#include "observe/rank_monitor.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace trainer {

namespace {

constexpr int kHostInts = 16;  // 64 bytes of host name per rank
constexpr int kFields = 11;    // per rank and report

}  // namespace

RankMonitor::RankMonitor(Communicator& host, int local_rank, const LogConfig& cfg, const std::string& run_dir,
                         bool append)
    : host_(host), threshold_(cfg.straggler_threshold), intervals_(cfg.straggler_intervals) {
  const int n = host.size();
  std::vector<int32_t> mine(kHostInts + 1, 0), all(size_t(n) * (kHostInts + 1), 0);
  char name[kHostInts * 4] = {};
  gethostname(name, sizeof name - 1);
  std::memcpy(mine.data(), name, sizeof name);
  mine[kHostInts] = local_rank;
  if (n > 1)
    host.all_gather(Tensor(all.data(), DType::I32, {int64_t(all.size())}), Tensor(mine.data(), DType::I32, {kHostInts + 1}));
  else
    all = mine;
  for (int r = 0; r < n; ++r) {
    char h[kHostInts * 4 + 1] = {};
    std::memcpy(h, all.data() + size_t(r) * (kHostInts + 1), kHostInts * 4);
    hosts_.emplace_back(h);
    local_ranks_.push_back(all[size_t(r) * (kHostInts + 1) + kHostInts]);
  }
  slow_.assign(size_t(n), 0);
  if (host.rank() == 0 && !run_dir.empty()) {
    const std::string path = run_dir + "/ranks.jsonl";
    out_ = std::fopen(path.c_str(), append ? "a" : "w");
    if (!out_) throw std::runtime_error(path + ": cannot open for writing: " + std::strerror(errno));
  }
}

RankMonitor::~RankMonitor() {
  if (out_) std::fclose(out_);
}

std::string RankMonitor::report(int64_t step, const RankReport& m) {
  const int n = host_.size();
  const double mine[kFields] = {m.tokens_per_s, m.step_ms, m.busy_ms(), m.grad_norm, 1e3 * m.time.data,
                                1e3 * m.time.forward, 1e3 * m.time.backward, 1e3 * m.time.optimizer,
                                1e3 * m.time.comm_total(), 1e3 * m.time.checkpoint, 1e3 * m.time.other};
  std::vector<double> all(size_t(n) * kFields);
  if (n > 1)
    host_.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size())}), Tensor(const_cast<double*>(mine), DType::F64, {kFields}));
  else
    std::copy(mine, mine + kFields, all.begin());
  if (host_.rank() != 0) return "";
  auto at = [&](int r, int f) { return all[size_t(r) * kFields + size_t(f)]; };
  std::vector<double> busy;
  for (int r = 0; r < n; ++r) busy.push_back(at(r, 2));
  std::vector<double> sorted = busy;
  std::sort(sorted.begin(), sorted.end());
  const double median = n % 2 ? sorted[size_t(n / 2)] : 0.5 * (sorted[size_t(n / 2 - 1)] + sorted[size_t(n / 2)]);
  std::string alerts;
  char buf[512];
  for (int r = 0; r < n; ++r) {
    const double ratio = median > 0 ? busy[size_t(r)] / median - 1 : 0;
    slow_[size_t(r)] = ratio > threshold_ ? slow_[size_t(r)] + 1 : 0;
    if (out_) {
      std::fprintf(out_,
                   "{\"step\": %lld, \"rank\": %d, \"host\": \"%s\", \"local_rank\": %d, \"tokens_per_s\": %.6g, "
                   "\"step_ms\": %.6g, \"busy_ms\": %.6g, \"grad_norm_shard\": %.6g, \"data_ms\": %.6g, "
                   "\"forward_ms\": %.6g, \"backward_ms\": %.6g, \"optimizer_ms\": %.6g, \"comm_ms\": %.6g, "
                   "\"checkpoint_ms\": %.6g, \"other_ms\": %.6g, \"slow_intervals\": %lld}\n",
                   (long long)step, r, hosts_[size_t(r)].c_str(), local_ranks_[size_t(r)], at(r, 0), at(r, 1), at(r, 2),
                   at(r, 3), at(r, 4), at(r, 5), at(r, 6), at(r, 7), at(r, 8), at(r, 9), at(r, 10),
                   (long long)slow_[size_t(r)]);
    }
    if (slow_[size_t(r)] == intervals_) {
      std::snprintf(buf, sizeof buf,
                    "straggler: rank %d (host %s, local rank %d) computes %.1f ms per step, %.0f%% above the median "
                    "%.1f ms, for %lld log intervals in a row (log.straggler_threshold=%g)\n",
                    r, hosts_[size_t(r)].c_str(), local_ranks_[size_t(r)], busy[size_t(r)], 100 * ratio, median,
                    (long long)intervals_, threshold_);
      alerts += buf;
    }
  }
  if (out_) std::fflush(out_);
  return alerts;
}

}  // namespace trainer
