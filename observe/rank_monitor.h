// Every rank's pace, every log interval (docs/ARCHITECTURE.md "Per-rank
// monitor"): tokens/s, step time, its time breakdown and the gradient norm
// of its shard go to rank 0, which appends one line per rank to
// <run dir>/ranks.jsonl and names a straggler: a rank whose busy time (the
// step minus the time it blocked in collectives; in a synchronous job every
// rank's wall time is the slowest one's, so only the busy time tells who is
// slow) is more than log.straggler_threshold above the median for
// log.straggler_intervals intervals in a row.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "observe/step_time.h"

namespace trainer {

struct RankReport {
  double tokens_per_s = 0, step_ms = 0, grad_norm = 0;  // grad_norm: of this rank's shard
  StepTime time;                                        // per step
  double busy_ms() const { return step_ms - 1e3 * time.comm_total(); }
};

class RankMonitor {
 public:
  // Collective over `host` (every rank): learns every rank's host name.
  RankMonitor(Communicator& host, int local_rank, const LogConfig& cfg, const std::string& run_dir, bool append);
  ~RankMonitor();
  RankMonitor(const RankMonitor&) = delete;
  RankMonitor& operator=(const RankMonitor&) = delete;
  // Collective: gathers the reports; on rank 0 writes ranks.jsonl and
  // returns the alert lines ("" when none); "" on the other ranks.
  std::string report(int64_t step, const RankReport& mine);

 private:
  Communicator& host_;
  double threshold_;
  int64_t intervals_;
  std::vector<std::string> hosts_;
  std::vector<int> local_ranks_;
  std::vector<int64_t> slow_;  // intervals in a row each rank has been slow
  FILE* out_ = nullptr;
};

}  // namespace trainer
