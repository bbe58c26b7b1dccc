#include "planner/step_estimate.h"

#include <algorithm>

#include "model/flops.h"
#include "model/sharding.h"
#include "optim/zero.h"
#include "planner/collective_cost.h"
#include "pipeline/long_simulation.h"
#include "pipeline/pipeline_plan.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"
#include "pipeline/stage_split.h"

namespace trainer {

namespace {

Axis axis_of(const std::string& label) {
  if (label == "tp") return Axis::TP;
  if (label == "cp") return Axis::CP;
  if (label == "ep") return Axis::EP;
  if (label == "edp") return Axis::EDP;
  if (label == "pp") return Axis::PP;
  return Axis::DP_CP;
}

int64_t calls_of(const GroupTraffic& gt) {
  int64_t n = 0;
  for (int64_t c : gt.payload.calls) n += c;
  return n;
}

// Latency of a group's calls in a step: each collective's fixed cost plus
// one step latency per message of its ring; a send or receive one message
// (planner/collective_cost.h, counted on the send).
double group_latency(const GroupTraffic& gt, double step_latency, const Hardware& hw) {
  const int p = std::max(1, gt.size);
  double s = 0;
  for (int k = 0; k < kCommKinds; ++k) {
    const double calls = double(gt.payload.calls[size_t(k)]);
    if (calls == 0 || CommKind(k) == CommKind::Recv) continue;
    s += calls * call_latency(CommKind(k), p, step_latency, hw);
  }
  return s;
}

// Forward FLOPs per micro-batch that a layer's recompute repeats in backward.
double recompute_flops(const ModelDims& g, int64_t layer, Recompute r) {
  if (r == Recompute::Full) return layer_flops(g, layer);
  if (r == Recompute::Selective) {
    const double qkv = 2 * double(g.N()) * double(g.C) * double(g.D) * double(g.Hq + 2 * g.Hkv);
    return qkv + attention_core_flops(g);
  }
  return 0;
}

// Per pipeline rank, seconds of one micro-batch over all its chunks: the
// forward, what recompute adds to the backward, and the attention core
// (forward and backward) that a cp ring hides behind.
struct RankCompute {
  std::vector<double> forward, extra, attention;
};

RankCompute rank_compute(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage) {
  const ModelDims g = make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
  const int V = mesh.pp * pipeline_chunks(c);
  const std::vector<int64_t> layers = stage_layers_for(c, g, V);
  const std::vector<double> fwd = stage_flops(g, layers);
  const double rate = hw.bf16_tflops * 1e12 * hw.matmul_efficiency;
  const double split = double(mesh.tp) * double(mesh.cp);
  RankCompute out;
  out.forward.assign(size_t(mesh.pp), 0);
  out.extra.assign(size_t(mesh.pp), 0);
  out.attention.assign(size_t(mesh.pp), 0);
  int64_t first = 0;
  for (int k = 0; k < V; ++k) {
    double extra = 0;
    for (int64_t i = 0; i < layers[size_t(k)]; ++i) extra += recompute_flops(g, first + i, g.recompute_of(i));
    const size_t r = size_t(k % mesh.pp);
    out.forward[r] += fwd[size_t(k)] / split / rate;
    out.extra[r] += extra / split / rate;
    out.attention[r] += 3 * attention_core_flops(g) * double(layers[size_t(k)]) / split / rate;
    first += layers[size_t(k)];
  }
  return out;
}

}  // namespace

double compute_seconds(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage) {
  const RankCompute rc = rank_compute(c, mesh, hw, storage);
  const double m = double(microbatches_per_step(c, mesh.dp));
  double worst = 0;
  for (size_t r = 0; r < rc.forward.size(); ++r) worst = std::max(worst, m * (3 * rc.forward[r] + rc.extra[r]));
  return worst;
}

GroupTime link_of(const MeshShape& mesh, Axis axis, const Hardware& hw) {
  GroupTime t;
  const std::vector<int> ranks = group_ranks(mesh, 0, axis);
  const int G = std::max(1, hw.gpus_per_node);
  int here = 0;
  for (int r : ranks) {
    if (r / G != ranks.front() / G) t.across_nodes = true;
    if (r / G == ranks.front() / G) ++here;
  }
  t.bandwidth = link_bandwidth(hw, t.across_nodes, here);
  t.step_latency = step_latency(hw, t.across_nodes);
  return t;
}

StepEstimate estimate_step(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage) {
  return estimate_step(c, mesh, hw, storage, layout_shardings(c, mesh, storage));
}

StepEstimate estimate_step(const Config& c, const MeshShape& mesh, const Hardware& hw, DType storage,
                           const LayoutShardings& lp) {
  StepEstimate e;
  const int64_t m = microbatches_per_step(c, mesh.dp);
  e.microbatches = m;
  e.tokens_per_step = int64_t(c.train.global_batch_size) * c.train.seq_len;
  const ModelDims g = make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
  const int chunks = pipeline_chunks(c);
  const RankCompute rc = rank_compute(c, mesh, hw, storage);

  // Transfers are counted on a schedule of at most the simulator's
  // cut-off (each micro-batch makes the same ones).
  const Schedule s = schedule_for(c, mesh.pp, std::min<int64_t>(m, long_simulation_cutoff(mesh.pp, chunks)));
  std::vector<ActionCosts> costs(size_t(mesh.pp));
  // Per pipeline rank: its own work, each part >= 0 (the step is at least
  // the largest of these sums; what it takes beyond is idle).
  struct RankWork {
    double compute = 0, recompute = 0, critical = 0, dp = 0, pp = 0, optimizer = 0;
    std::vector<GroupTime> groups;
    double total() const { return compute + critical + dp + pp + optimizer; }
  };
  std::vector<RankWork> work(size_t(mesh.pp));
  double message_s = 0;  // one pipeline message, the slowest rank's
  const double opt_rate = hw.hbm_gb_s > 0 ? hw.hbm_gb_s * 1e9 : 1e12;
  for (int r = 0; r < mesh.pp; ++r) {
    RankWork& w = work[size_t(r)];
    const double fw = rc.forward[size_t(r)], ex = rc.extra[size_t(r)], at = rc.attention[size_t(r)];
    w.compute = double(m) * (3 * fw + ex);
    w.recompute = double(m) * ex;
    const StepTraffic traffic = step_traffic(c, mesh, r, m, lp.plans(r), s);
    const double backward_mb = 2 * fw + ex;  // all chunks of one micro-batch
    for (const GroupTraffic& gt : traffic.groups) {
      if (gt.size <= 1 && gt.wire_bytes == 0) continue;
      GroupTime t = link_of(mesh, axis_of(gt.label), hw);
      t.label = gt.label;
      t.size = gt.size;
      t.note = gt.note;
      t.wire_bytes = gt.wire_bytes;
      t.payload = group_payload(gt.label, gt.payload);
      t.latency = group_latency(gt, t.step_latency, hw);
      t.seconds = gt.wire_bytes / t.bandwidth + t.latency;
      if (gt.label == "tp" || gt.label == "ep") {
        t.exposed = t.seconds;
        w.critical += t.exposed;
      } else if (gt.label == "cp") {
        // The ring hides behind attention; MoE's routing collectives cannot.
        t.exposed = std::max(0.0, gt.wire_overlap / t.bandwidth - double(m) * at) + gt.wire_critical / t.bandwidth;
        t.exposed = std::min(t.seconds, t.exposed + t.latency);  // each message's latency stalls the ring
        w.critical += t.exposed;
      } else if (gt.label == "pp") {
        // Its messages run inside the schedule's simulation, below.
        const double sends = double(std::max<int64_t>(1, gt.payload.calls[size_t(CommKind::Send)]));
        message_s = std::max(message_s, t.seconds / sends);
        t.exposed = t.seconds;
      } else {
        // ZeRO: per reduction round, what the backward (and at stage 3 the
        // forward) cannot hide, and at least the last unit's reduction;
        // never more than the round itself.
        const double rounds = double(gt.reductions);
        const double per_round = gt.wire_overlap / t.bandwidth / rounds;
        const double hide = c.parallel.zero_stage >= 3 ? backward_mb + fw : backward_mb;
        const double last = std::min(per_round, gt.wire_last_bucket / t.bandwidth);
        t.exposed = gt.wire_overlap > 0 ? rounds * std::max(per_round - hide, last) : 0;
        // ZeRO 1-2's gathers of the updated weights run into the next
        // step, each waited for at its unit's first forward: the first
        // micro-batch's forward hides them but for the first unit's gather
        // (the embedding, the same unit as the last reduction).
        const double after = gt.wire_after_step / t.bandwidth;
        t.exposed += after > 0 ? std::max(after - fw, std::min(after, gt.wire_last_bucket / t.bandwidth)) : 0;
        // The last unit's reduction waits its calls' latency too.
        if (gt.wire_overlap > 0 || gt.wire_after_step > 0) t.exposed = std::min(t.seconds, t.exposed + t.latency / double(std::max<int64_t>(1, calls_of(gt))));
        w.dp += t.exposed;
      }
      w.groups.push_back(t);
    }
    // The critical communication of a micro-batch runs inside its actions.
    const double per_action = w.critical / double(m) / double(chunks) / 2;
    costs[size_t(r)].forward = fw / double(chunks) + per_action;
    costs[size_t(r)].backward = (2 * fw + ex) / double(chunks) + per_action;
    costs[size_t(r)].backward_input = costs[size_t(r)].backward_weight = costs[size_t(r)].backward / 2;
    double optimizer_bytes = 0;
    for (const ShardingPlan& p : lp.plans(r))
      optimizer_bytes += double(zero_bytes(p, c.parallel.zero_stage).optimizer);
    w.optimizer = 2 * optimizer_bytes / opt_rate;
  }
  const Simulation sim = simulate_long(c, mesh.pp, m, costs, message_s);
  if (!sim.ok) throw std::logic_error("pipeline schedule: " + sim.error);
  // What the pipeline's messages add to the step, as the schedule's
  // transfer mode hides or exposes them (TransferMode).
  if (message_s > 0) {
    const double free = simulate_long(c, mesh.pp, m, costs).step_time;
    for (RankWork& w : work)
      for (GroupTime& t : w.groups)
        if (t.label == "pp") w.pp = t.exposed = std::min(t.seconds, std::max(0.0, sim.step_time - free));
  }
  Schedule shape;  // the formula reads the shape only
  shape.kind = s.kind;
  shape.stages = s.stages;
  shape.chunks = s.chunks;
  shape.microbatches = int(m);
  const TextbookBubble tb = textbook_bubble(shape);
  e.textbook_bubble = tb.value;
  e.textbook_formula = tb.formula;
  e.pipeline_s = sim.step_time;
  e.bubble = sim.bubble();
  for (double b : sim.busy) e.stage_idle_s.push_back(std::max(0.0, sim.step_time - b));
  // The schedule runs every rank's compute, critical communication and
  // pipeline messages; the exposed data-parallel transfers and the
  // optimizer follow it.
  double tail = 0;
  for (const RankWork& w : work) tail = std::max(tail, w.dp + w.optimizer);
  e.step_s = sim.step_time + tail;
  // The step is split on the critical stage, the one with the most work of
  // its own: a simulated rank is busy for exactly its compute and critical
  // communication, so step >= that stage's total and every part is >= 0.
  for (int r = 0; r < mesh.pp; ++r)
    if (work[size_t(r)].total() > work[size_t(e.critical_stage)].total()) e.critical_stage = r;
  const RankWork& w = work[size_t(e.critical_stage)];
  e.compute_s = w.compute;
  e.recompute_s = w.recompute;
  e.exposed_comm_s = w.critical + w.dp + w.pp;
  e.optimizer_s = w.optimizer;
  e.groups = w.groups;
  for (const RankWork& each : work) e.stage_groups.push_back(each.groups);
  e.idle_s = std::max(0.0, e.step_s - w.total());
  e.tokens_per_s = double(e.tokens_per_step) / e.step_s;
  e.model_flops_per_step = flops_per_token(g) * double(e.tokens_per_step);
  e.mfu = e.model_flops_per_step / (e.step_s * double(mesh.world()) * hw.bf16_tflops * 1e12);
  return e;
}

}  // namespace trainer
