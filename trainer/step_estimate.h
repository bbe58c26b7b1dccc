// The time model of `trainer plan` (docs/PLANNING.md "Time"): one step of a
// layout on a hardware entry, from FLOPs, bytes and bandwidths. Predictions,
// not measurements.
//
//   compute    forward FLOPs of each (virtual) stage per micro-batch / (tp
//              x cp), backward twice that, plus what recompute repeats
//              (full: the layer's forward; selective: the QKV projection
//              and the attention core), at bf16 peak x matmul_efficiency
//   tp, ep     on the critical path: added to the forward and backward of
//              every micro-batch (half each)
//   cp         the ring overlaps the attention core it feeds; what exceeds
//              the attention time is added like tp
//   pipeline   the schedule simulated with those action costs
//              (pipeline/simulate.h): its step time includes the bubble
//   dp / ZeRO  reductions hide behind the backward that issues them (the
//              last micro-batch's at stages 0-1, every micro-batch's at 2-3)
//              except the last unit's; ZeRO-3's gathers hide behind the
//              compute they are prefetched for; the all-gather after the
//              optimizer step (stages 1-2) is exposed
//   pp p2p     exposed: every transfer of the rank's schedule
//   optimizer  memory bound: the optimizer state read and written once
//
// Links: a group inside a node at nvlink_gb_s / 2 per direction; a group
// across nodes at network_gbit_s per GPU times its members per node (the
// node's NICs are shared by the groups crossing it at once).
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "trainer/comm_plan.h"
#include "trainer/hardware.h"
#include "trainer/layout_plans.h"
#include "trainer/plan.h"

namespace trainer {

struct GroupTime {
  std::string label;
  bool across_nodes = false;
  double bandwidth = 0;  // bytes/s per rank, per direction
  double seconds = 0;    // all of the group's wire bytes at that bandwidth
  double exposed = 0;    // on the critical path
};

struct StepEstimate {
  int64_t microbatches = 1, tokens_per_step = 0;
  double compute_s = 0;        // this rank's matmul time per step, without communication
  double recompute_s = 0;      // the part of compute_s that recompute repeats
  double pipeline_s = 0;       // simulated schedule: compute + critical comm + bubble
  double bubble = 0;           // simulated idle share of the schedule
  double textbook_bubble = 0;  // (p-1)/(m+p-1) or the schedule's own formula
  const char* textbook_formula = "";
  double optimizer_s = 0;
  std::vector<GroupTime> groups;
  double exposed_comm_s = 0;   // sum of the groups' exposed time
  double step_s = 0;
  double tokens_per_s = 0;
  double mfu = 0;              // model FLOPs (trainer/step_time.h convention) / (step x world x peak)
  double model_flops_per_step = 0;
};

// The rank at `at` of this layout (the plan reports every pipeline stage's
// and takes the slowest).
StepEstimate estimate_step(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage);
StepEstimate estimate_step(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage,
                           const LayoutPlans& plans);

// The matmul time of one step on the busiest rank, recompute included
// (StepEstimate::compute_s without the rest).
double compute_seconds(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage);

// Bytes/s of one rank of the group `label` along `axis` (inside a node or across).
GroupTime link_of(const MeshShape& mesh, Axis axis, const Hardware& hw);

}  // namespace trainer
