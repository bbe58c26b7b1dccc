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
//   MFU        model/flops.h's model FLOPs (causal attention at half the
//              T x T work, as the compute above) / (step x GPUs x peak)
//
// Links: a group inside a node at nvlink_gb_s / 2 per direction; a group
// across nodes at network_gbit_s per GPU times its members per node (the
// node's NICs are shared by the groups crossing it at once). Latency: each
// call collective_latency_us, plus a step latency (nvlink_latency_us or
// network_latency_us) per message of its ring: 2(p-1) for an all-reduce,
// p-1 for the other collectives, 1 for a pipeline send.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "planner/comm_plan.h"
#include "planner/hardware.h"
#include "planner/layout_shardings.h"
#include "planner/memory_plan.h"

namespace trainer {

struct GroupTime {
  std::string label;
  int size = 1;          // ranks of the group
  bool across_nodes = false;
  double bandwidth = 0;  // bytes/s per rank, per direction
  double payload = 0;    // bytes per step as a run counts them (pp, cp: the sends)
  double wire_bytes = 0; // bytes per step this rank sends (planner/comm_plan.h)
  double seconds = 0;    // all of the group's wire bytes at that bandwidth, plus latency
  double latency = 0;    // the part of seconds that is latency: per call and per ring step
  double step_latency = 0;  // seconds per message on this group's link
  double exposed = 0;    // on the critical path, 0 <= exposed <= seconds
  std::string note;      // how the bytes come about and what hides them
};

// One step, split on its critical pipeline stage (the one with the most work
// of its own) into parts that are each >= 0 and add up:
//   step_s = compute_s + exposed_comm_s + idle_s + optimizer_s
struct StepEstimate {
  int64_t microbatches = 1, tokens_per_step = 0;
  int critical_stage = 0;      // the pipeline stage the parts below are of
  double compute_s = 0;        // its matmul time per step, without communication
  double recompute_s = 0;      // the part of compute_s that recompute repeats
  double exposed_comm_s = 0;   // its groups' exposed time: tp/ep/cp inside the actions, dp/ZeRO and pp after
  double idle_s = 0;           // waiting in the schedule: the bubble and slower stages
  double optimizer_s = 0;
  double pipeline_s = 0;       // simulated schedule: compute + critical comm + bubble (the slowest rank)
  double bubble = 0;           // simulated idle share of the schedule (mean over ranks)
  std::vector<double> stage_idle_s;  // per pipeline rank: the schedule's time it does not compute
  double textbook_bubble = 0;  // (p-1)/(m+p-1) or the schedule's own formula
  const char* textbook_formula = "";
  std::vector<GroupTime> groups;  // of the critical stage
  std::vector<std::vector<GroupTime>> stage_groups;  // of every pipeline stage, by stage
  double step_s = 0;
  double tokens_per_s = 0;
  // model FLOPs (model/flops.h, as a run's MFU counts them) / (step x world
  // x peak); never above hw.matmul_efficiency, since every GPU's compute
  // alone takes at least its share of those FLOPs at peak x efficiency.
  double mfu = 0;
  double model_flops_per_step = 0;
};

// The rank at `at` of this layout (the plan reports every pipeline stage's
// and takes the slowest).
StepEstimate estimate_step(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage);
StepEstimate estimate_step(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage,
                           const LayoutShardings& plans);

// The matmul time of one step on the busiest rank, recompute included
// (StepEstimate::compute_s without the rest).
double compute_seconds(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage);

// Bytes/s of one rank of the group `label` along `axis` (inside a node or across).
GroupTime link_of(const MeshShape& mesh, Axis axis, const Hardware& hw);

}  // namespace trainer
