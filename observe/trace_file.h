// log.trace: a window of steps recorded on every rank (core/trace.h) and
// merged by rank 0 into one Chrome trace-event file, <run dir>/trace.json,
// that Perfetto (ui.perfetto.dev) and chrome://tracing open: one process row
// per rank ("rank 3 (node-b)"), one thread row per track (compute, each
// group's communication, sends and receives, data loading, checkpoint
// writing). docs/OBSERVABILITY.md "A timeline of every rank".
//
// Clocks: each rank measures its steady clock against rank 0's through the
// store (a few set/get round trips, the one with the shortest round trip
// kept; its half is the uncertainty) and shifts its spans onto rank 0's
// clock, so that the rows of different hosts line up. The offsets are
// printed and kept in the file's "otherData".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"
#include "config/config.h"
#include "core/trace.h"
#include "pipeline/simulate.h"

namespace trainer {

// One rank's recording as trace events: pid `pid`, process and thread
// names, ts in microseconds since `origin_ns` (rank 0's clock) after
// subtracting `offset_ns` (this clock minus rank 0's). Events joined by
// ",\n", no brackets.
std::string chrome_events(const trace::Recording& rec, int pid, const std::string& process_name, int64_t offset_ns,
                          int64_t origin_ns);
// The whole file: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {other}}.
std::string chrome_document(const std::vector<std::string>& event_lists, const std::string& other_json);
// Written to `path`.partial, then renamed over `path`; throws naming the path.
void write_trace_file(const std::string& path, const std::string& text);

// `trainer schedule --trace`: the simulator's pipeline (pipeline/simulate.h)
// in the same format, one process row per pipeline rank, `ms_per_unit`
// milliseconds per time unit of the simulation (1 unit = a forward of the
// heaviest stage), so that it opens beside a measured trace.
std::string simulated_trace(const Schedule& schedule, const Simulation& sim, double ms_per_unit);

struct ClockOffset {
  int64_t offset_ns = 0;  // this rank's clock minus rank 0's
  int64_t rtt_ns = 0;     // of the round kept: the offset is good to half of it
};

class RunTrace {
 public:
  struct Setup {
    std::optional<StepRange> steps;  // nullopt: no trace
    Store* store = nullptr;          // null: one process
    int rank = 0, world = 1;
    std::string host;  // this rank's node, for its row's name
    std::string path;  // <run dir>/trace.json
    bool quiet = false;
  };
  explicit RunTrace(Setup s);
  // `step` counted from 1. Recording starts before the window's first step
  // (or the first step run, on a resume inside the window).
  void before_step(int64_t step);
  // After the window's last step: recording stops and the ranks' spans are
  // merged and written (collective: every rank calls it at the same step).
  void after_step(int64_t step);
  // Whether after_step(step) merges and writes (the watchdog names the phase).
  bool writes_after(int64_t step) const;
  bool recording() const { return recording_; }
  // The loop ended inside the window (preempted, diverged): what was
  // recorded is written (collective).
  void finish();

 private:
  Setup s_;
  bool recording_ = false, done_ = false;
  int64_t first_seen_ = 0, last_seen_ = 0;
  void write();
};

}  // namespace trainer
