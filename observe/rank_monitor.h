// Every rank's pace, every log interval (docs/ARCHITECTURE.md "Per-rank
// monitor"): tokens/s, step time, its time breakdown, the gradient norm of
// its shard and how long the other ranks waited for it in collectives
// (observe/wait_attribution.h) go to rank 0, which appends one line per rank
// to <run dir>/ranks.jsonl and names a straggler: a rank the others waited
// for more than log.straggler_threshold of the step, averaged over the last
// log.straggler_intervals intervals (a stop that lands inside a collective
// delays every member alike and is nobody's, so one interval's share
// wanders; the average does not). Not its busy time against the
// median (also logged): on a loaded host every rank's busy time wanders, and
// a rank that is stopped now and then shows its stops as the others'
// waiting, barely in its own median.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/gpu_health.h"
#include "config/config.h"
#include "observe/placement_report.h"
#include "observe/step_time.h"

namespace trainer {

struct RankReport {
  double tokens_per_s = 0, step_ms = 0, grad_norm = 0;  // grad_norm: of this rank's shard
  StepTime time;                                        // per step
  GpuHealth gpu;                                        // NVML's sample (runtime/nvml.h); read = false without
  double busy_ms() const { return step_ms - 1e3 * time.comm_total(); }
};

class RankMonitor {
 public:
  // `places`: every rank's host name and local rank (observe/placement_report.h).
  RankMonitor(Communicator& host, const RankPlaces& places, const LogConfig& cfg, const std::string& run_dir,
              bool append);
  ~RankMonitor();
  RankMonitor(const RankMonitor&) = delete;
  RankMonitor& operator=(const RankMonitor&) = delete;
  // Collective: gathers the reports; on rank 0 writes ranks.jsonl and
  // returns the alert lines ("" when none); "" on the other ranks.
  // held_ms: per rank, the milliseconds per step an average other rank
  // waited for it (the same on every rank).
  // A straggler whose GPU throttles is named with the cause
  // (observe/gpu_report.h: "SM clock 1.21 of 1.98 GHz, thermal slowdown").
  std::string report(int64_t step, const RankReport& mine, const std::vector<double>& held_ms);
  // Every rank's GPU sample of the last report (rank 0; for TensorBoard).
  const std::vector<GpuHealth>& gpus() const { return gpus_; }

 private:
  Communicator& host_;
  double threshold_;
  int64_t intervals_;
  std::vector<std::string> hosts_;
  std::vector<int> local_ranks_;
  std::vector<std::deque<double>> shares_;  // per rank, its last intervals' share of the step the others waited for it
  std::vector<int64_t> slow_;                // intervals in a row each rank's average has been above the threshold
  std::vector<GpuHealth> gpus_;
  FILE* out_ = nullptr;
};

}  // namespace trainer
