// Bytes and time per step on the links of a run, from its own counters:
// each of rank 0's groups (tp, dp_cp, pp, ...) inside a node or across
// nodes (the hosts every rank reported at start-up), the payload it moved
// per step and the time rank 0 spent in it, next to what the planner's time
// model (planner/step_estimate.h) predicts for the same group on the
// configuration's `hardware:` entry, when the configuration has one (an
// emulated cluster's shaped link, say). The measured time is what the rank
// waited in the group's collectives, peers' lateness included.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "planner/hardware.h"
#include "planner/step_estimate.h"

namespace trainer {

struct LinkUse {
  std::string label;     // the group ("tp", "dp_cp", ...)
  int size = 1;
  double bytes = 0;      // payload per step, as the run counts it
  double seconds = 0;    // in the group's collectives per step
};

// "links per step, rank 0 (2 nodes): tp inside node trn-node0: 163840 B in
//  80.5 ms; dp_cp across nodes: 70272 B in 3.7 ms (19.4 MB/s)\n" and, with
// `predicted`, "links per step, planner on hardware 'netns' (in-node 10.0
// GB/s, network 1 Gbit/s per rank): tp 163840 B in 0.03 ms; dp_cp 70272 B
// in 0.56 ms\n". Groups of one rank are left out. `json`: the same as one
// metrics.jsonl object.
std::string format_link_report(const MeshShape& mesh, int rank, const std::vector<std::string>& host_of_rank,
                               const std::vector<LinkUse>& measured, const StepEstimate* predicted,
                               const Hardware* hw, std::string* json);

// The planner's step next to the measured one: "step time model on
// hardware 'netns': predicted 52.1 ms (compute 30.2 + exposed communication
// 20.0 + idle 1.4 + optimizer 0.5); measured 61.3 ms per step (rank 0, mean
// of 12 steps)\n", and {"step_model": {...}} in *json.
std::string format_step_model(const StepEstimate& predicted, const Hardware& hw, double measured_s, int64_t steps,
                              std::string* json);

}  // namespace trainer
