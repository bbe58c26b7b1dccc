// Where the time of the steps went on this rank (docs/ARCHITECTURE.md
// "Where the time went"): compute of the forwards and backwards (without
// the collectives inside them), the optimizer, waiting for data, the
// checkpoint stall, evaluation, and the exposed communication per group
// (the time the rank blocked in each group's collectives, measured by
// comm/timed_communicator.h: pipeline idle is the pp group's share).
// "other" is the rest of the wall time (logging, bookkeeping), so the parts
// always add up; a small "other" is what says the parts explain the step.
// Also the device peak behind the MFU figures (their FLOPs: model/flops.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>


namespace trainer {

struct StepTime {
  double data = 0, forward = 0, backward = 0, optimizer = 0, checkpoint = 0, eval = 0, other = 0;
  std::vector<std::pair<std::string, double>> comm;  // per group label, seconds blocked (exposed)
  // Per group label, seconds its communication ran (TimedCommunicator::
  // busy_seconds): not a part of the step; busy - exposed is what ran
  // hidden behind compute.
  std::vector<std::pair<std::string, double>> busy;
  double comm_total() const;
  double named() const;  // everything but `other`
  void add_comm(const std::string& group, double seconds);
  void add_busy(const std::string& group, double seconds);
  StepTime& operator+=(const StepTime& o);
};

// "time_ms": {...} per step of a window of `steps` steps lasting `wall` s
// (other = wall - the named parts), then "comm_busy_ms": {...} per group.
StepTime per_step(StepTime window, double wall, int64_t steps);
std::string step_time_json(const StepTime& per_step);
// The end-of-run table: each part's share of the run, then each group's
// exposed communication against its busy time.
std::string format_step_time(const StepTime& total, double wall, int64_t steps);
// TensorBoard scalars of a window's per-step times: "time/<part>_ms",
// "comm/<group>_exposed_ms", "comm/<group>_busy_ms".
std::vector<std::pair<std::string, double>> step_time_scalars(const StepTime& per_step);

// Peak dense TFLOP/s of one device for the run's precision: train.peak_tflops
// when > 0, else from a table of GPUs by the name in `device_line`; 0 when
// unknown (the CPU), and MFU is not printed.
double peak_tflops(const std::string& device_line, bool low_precision, double configured);

}  // namespace trainer
