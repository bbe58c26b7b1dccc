// What a run observes between two logged steps (log.interval), and over the
// whole run: where the time went (observe/step_time.h) per part and per
// process group, the throughput and MFU, every rank's pace for the rank
// monitor, each expert's load (MoE) and each pipeline stage's idle time
// next to the simulator's bubble. The loop tells it what happened; at a
// logged step it prints and records the window and starts the next one.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"
#include "comm/timed_communicator.h"
#include "config/config.h"
#include "core/trace.h"
#include "model/dims.h"
#include "model/expert_load.h"
#include "observe/comm_measured.h"
#include "observe/metrics.h"
#include "observe/rank_monitor.h"
#include "observe/link_report.h"
#include "observe/step_time.h"
#include "pipeline/simulate.h"

namespace trainer {

class StepWindow {
 public:
  using clock_type = std::chrono::steady_clock;

  struct Setup {
    Communicator* host = nullptr;
    const std::vector<std::unique_ptr<TimedCommunicator>>* timed = nullptr;
    MetricsLog* log = nullptr;
    MeshShape mesh;
    const Simulation* simulated = nullptr;  // the pipeline's predicted bubble
    ModelDims dims;
    int world_size = 1;
    const RankPlaces* places = nullptr;  // every rank's host and local rank
    int rank = 0;
    // The planner's step on the configuration's `hardware:` entry, when it
    // has one: the end-of-run link report compares (observe/link_report.h).
    const StepEstimate* predicted = nullptr;
    const Hardware* hardware = nullptr;
    bool lead = false, quiet = false;
    double model_flops = 0;  // per token (model/flops.h)
    double peak = 0;         // TFLOP/s of one device; 0: unknown
    std::string run_dir;     // the rank monitor's ranks.jsonl; "" on other ranks
    bool resumed = false;
    // This rank's GPU sample at each log window (runtime/nvml.h); empty: none.
    std::function<GpuHealth()> gpu;
  };
  StepWindow(const Setup& s, const LogConfig& log_cfg);

  // An iteration of the loop starts (applied or not, it counts for the time).
  void begin_iteration();
  // This window's time by part; the loop adds data, forward and backward.
  StepTime& parts() { return window_parts_; }
  void add_pipeline_wait(double seconds) { window_wait_s_ += seconds; }
  // The optimizer's share of a step: its wall time less what its
  // collectives blocked (those count for their group).
  template <class Work>
  void as_optimizer(Work&& work) {
    const auto t = clock_type::now();
    const double blocked = total_blocked_seconds();
    const trace::Scope span("optimizer", "optimizer");
    work();
    window_parts_.optimizer += seconds_since(t) - (total_blocked_seconds() - blocked);
  }
  // The experts' load counter of a step (reset), when the step logs; null otherwise.
  ExpertLoad* expert_load_of_step(bool log_step);

  // An applied step: its throughput fields filled in; at a logged step the
  // window is printed, recorded and restarted. rank_grad_norm: the norm of
  // this rank's gradient shard, for the rank monitor.
  void applied_step(StepMetrics sm, int64_t step_tokens, bool log_step, double rank_grad_norm);
  // A checkpoint save or an evaluation: timed as such, and not throughput.
  template <class Work>
  void as_checkpoint(Work&& work) {
    const auto k0 = clock_type::now();
    {
      const trace::Scope span("checkpoint", "checkpoint");
      work();
    }
    throughput_start_ = clock_type::now();
    window_parts_.checkpoint += seconds_since(k0);
  }
  template <class Work>
  void as_eval(Work&& work) {
    const auto e0 = clock_type::now();
    const double eb0 = total_blocked_seconds();
    {
      const trace::Scope span("eval", "evaluation");
      work();
    }
    throughput_start_ = clock_type::now();
    window_parts_.eval += seconds_since(e0) - (total_blocked_seconds() - eb0);
  }

  // The end of the run: the time table (the lead, unless quiet; true when
  // printed) and, unless the run was preempted, the bytes each group moved
  // (collective over the host group: every rank calls it).
  bool print_step_time();
  void report_traffic(bool preempted);
  int64_t iterations() const { return run_iterations_; }

 private:
  static double seconds_since(clock_type::time_point t) {
    return std::chrono::duration<double>(clock_type::now() - t).count();
  }
  StepTime comm_now() const;
  StepTime comm_delta(const StepTime& from) const;
  void close_window(const StepMetrics& sm, double secs, double rank_grad_norm);
  void report_links();

  Setup s_;
  RankMonitor monitor_;
  ExpertLoad expert_load_;
  clock_type::time_point throughput_start_;
  int64_t window_tokens_ = 0, window_steps_ = 0;
  double window_wait_s_ = 0;  // time this rank waited for pipeline neighbours
  StepTime window_parts_, run_parts_;
  StepTime window_comm0_, run_comm0_;
  std::vector<CommBytes> run_bytes0_;
  clock_type::time_point window_wall0_, run_wall0_;
  int64_t window_iterations_ = 0, run_iterations_ = 0;
};

}  // namespace trainer
