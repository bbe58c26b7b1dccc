// What one training step moves over each process group of one rank, by
// collective kind, predicted from the same plans the run executes
// (docs/PLANNING.md "Communication"):
//
//   tp      model/tp_traffic.h (the blocks' collectives, exact)
//   cp      the ring of K/V blocks inside attention (observe/context_report.h)
//   ep      per MoE layer and micro-batch: the all-gather of the routing
//           offsets (exact) and four all-to-alls (dispatch and combine,
//           forward and backward) whose sizes depend on the routing: the
//           rows a rank dispatches are its own N K (exact without a
//           capacity), the rows it receives are estimated at uniform
//           routing, so the mean over the ranks is exact, one rank is not
//   dp_cp   ZeRO of the dense units over dp x cp (optim/zero_traffic.h)
//   edp     ZeRO of the expert units over the expert data-parallel group
//   pp      activations and gradients of the rank's schedule (sp shards
//           passed as shards), the tied embedding's gradient sum
//
// Payload as comm/timed_communicator.h counts it, so a run's measured
// bytes per step (observe/comm_measured.h) compare one to one.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "comm/timed_communicator.h"
#include "config/config.h"
#include "core/tensor.h"
#include "model/dims.h"
#include "model/sharding.h"

namespace trainer {

struct GroupTraffic {
  std::string label;        // the run's group label: "tp", "cp", "ep", "dp_cp", "edp", "pp"
  int size = 1;             // ranks of the group
  CommBytes payload;        // per step, as TimedCommunicator counts
  double wire_bytes = 0;    // sent by each rank per step (ring algorithms; p2p: the sends)
  // Parts for the time model (bytes sent per rank per step).
  double wire_critical = 0; // on the critical path by nature (tp, ep, pp)
  double wire_overlap = 0;  // may hide behind compute (cp ring, ZeRO reductions, ZeRO-3 gathers)
  double wire_after_step = 0;  // after the optimizer step (ZeRO 1-2 all-gather): hides behind the next forward
  double wire_last_bucket = 0; // ZeRO: the last unit's reduction, which backward cannot hide (per reduction)
  int64_t reductions = 1;      // ZeRO: how often per step the reductions run (1, or micro-batches at 2-3)
  std::string note;         // how the bytes come about
};

struct StepTraffic {
  std::vector<GroupTraffic> groups;  // only groups of more than one rank, or that carry bytes
  const GroupTraffic* find(const std::string& label) const;
};

// Activation recompute repeats forward collectives in the backward. Which
// ones the model re-runs, per recomputed layer (keep in step with the model's
// recompute: full re-runs the whole block forward, so its cp ring forward
// and its MoE routing and dispatch/combine; selective re-runs attention's
// internals up to the attention output, so the cp ring forward). Tensor
// parallel repeats come with model/tp_traffic.h.
struct RecomputeRepeats {
  bool cp_ring_forward = false;
  bool ep_forward = false;  // offsets all-gather, dispatch and combine all-to-alls
};
RecomputeRepeats recompute_repeats(Recompute r);

// A group's bytes per step as one number, the way the time model and the
// run's link report both count them: every kind, but pp and cp (whose
// batches send as much as they receive) by their sends.
double group_payload(const std::string& label, const CommBytes& bytes);

// One step of `micro_batches` micro-batches on the rank at `at`.
StepTraffic step_traffic(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                         int64_t micro_batches);
// The same from the rank's chunk plans and this run's schedule (schedule_for).
struct Schedule;
StepTraffic step_traffic(const Config& c, const MeshShape& mesh, int pp_rank, int64_t micro_batches,
                         const std::vector<ShardingPlan>& plans, const Schedule& schedule);

}  // namespace trainer
