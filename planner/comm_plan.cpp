#include "planner/comm_plan.h"

#include <algorithm>

#include "model/tp_traffic.h"
#include "optim/zero_traffic.h"
#include "pipeline/pipeline_plan.h"
#include "pipeline/schedule.h"
#include "model/cp_traffic.h"

namespace trainer {

double group_payload(const std::string& label, const CommBytes& bytes) {
  if (label == "pp" || label == "cp") return double(bytes.of(CommKind::Send));
  double total = 0;
  for (int64_t b : bytes.bytes) total += double(b);
  return total;
}

const GroupTraffic* StepTraffic::find(const std::string& label) const {
  for (const GroupTraffic& g : groups)
    if (g.label == label) return &g;
  return nullptr;
}

RecomputeRepeats recompute_repeats(Recompute r) {
  RecomputeRepeats x;
  x.cp_ring_forward = r != Recompute::None;
  x.ep_forward = r == Recompute::Full;
  return x;
}

namespace {

double ring(int p) { return p > 1 ? double(p - 1) / double(p) : 0; }

GroupTraffic tp_group(const std::vector<ShardingPlan>& plans, int64_t m) {
  const TpTraffic t = tp_traffic(plans, m);
  GroupTraffic g;
  g.label = "tp";
  g.size = plans.front().mesh.tp;
  for (const TpCollective& c : t.collectives)
    for (int64_t k = 0; k < c.calls; ++k)
      g.payload.add(c.op == TpOp::AllReduce   ? CommKind::AllReduce
                    : c.op == TpOp::AllGather ? CommKind::AllGather
                                              : CommKind::ReduceScatter,
                    c.payload);
  g.wire_bytes = g.wire_critical = double(t.wire_bytes_per_rank());
  g.note = "in the blocks, forward and backward: on the critical path";
  return g;
}

GroupTraffic cp_group(const std::vector<ShardingPlan>& plans, int64_t m) {
  GroupTraffic g;
  g.label = "cp";
  g.size = plans.front().mesh.cp;
  if (g.size <= 1) return g;
  for (const ShardingPlan& p : plans) {
    const ModelDims& d = p.local;
    const RingTraffic r = ring_traffic(d);
    for (int64_t i = 0; i < d.L; ++i) {
      double per_mb = r.forward_bytes + r.backward_bytes;
      if (recompute_repeats(d.recompute_of(i)).cp_ring_forward) per_mb += r.forward_bytes;
      // Each batch sends as many bytes as it receives.
      const int64_t b = int64_t(per_mb) * m;
      g.payload.bytes[size_t(CommKind::Send)] += b;
      g.payload.bytes[size_t(CommKind::Recv)] += b;
      g.wire_overlap += double(b);
      // A MoE layer's whole-sequence routing (model/moe_routing_plan.h): the
      // router statistics [2, E] F32 all-reduced, and with a capacity every
      // rank's expert choices [N, K] I32 all-gathered; again when a full
      // recompute re-runs the forward.
      if (!d.moe_layer(i)) continue;
      const int64_t runs = m * (recompute_repeats(d.recompute_of(i)).ep_forward ? 2 : 1);
      const int64_t stats = 2 * d.E * 4, choices = d.capacity > 0 ? int64_t(g.size) * d.N() * d.K * 4 : 0;
      for (int64_t k = 0; k < runs; ++k) {
        g.payload.add(CommKind::AllReduce, stats);
        if (choices > 0) g.payload.add(CommKind::AllGather, choices);
      }
      g.wire_critical += double(runs) * (2 * ring(g.size) * double(stats) + ring(g.size) * double(choices));
    }
  }
  g.wire_bytes = g.wire_overlap + g.wire_critical;
  g.note = "K/V blocks around the ring while attention computes on the block in hand (MoE: the router statistics "
           "and expert choices on the critical path)";
  return g;
}

GroupTraffic ep_group(const std::vector<ShardingPlan>& plans, int64_t m) {
  GroupTraffic g;
  g.label = "ep";
  g.size = plans.front().mesh.ep;
  if (g.size <= 1) return g;
  for (const ShardingPlan& p : plans) {
    const ModelDims& d = p.local;
    const int64_t offsets = int64_t(d.ep) * (d.E + 1) * 4;  // int32 [ep, E + 1]
    const int64_t rows = d.N() * d.K * d.C * int64_t(dtype_size(d.act));
    for (int64_t i = 0; i < d.L; ++i) {
      if (!d.moe_layer(i)) continue;
      const int64_t runs = recompute_repeats(d.recompute_of(i)).ep_forward ? 2 : 1;
      for (int64_t k = 0; k < m; ++k) {
        for (int64_t r = 0; r < runs; ++r) {
          g.payload.add(CommKind::AllGather, offsets);
          g.payload.add(CommKind::AllToAll, rows);  // dispatch
          g.payload.add(CommKind::AllToAll, rows);  // combine (uniform routing)
        }
        g.payload.add(CommKind::AllToAll, rows);  // backward of the combine
        g.payload.add(CommKind::AllToAll, rows);  // backward of the dispatch (uniform routing)
      }
    }
  }
  g.wire_bytes = g.wire_critical = ring(g.size) * double(g.payload.of(CommKind::AllToAll)) +
                                   ring(g.size) * double(g.payload.of(CommKind::AllGather));
  g.note = "all-to-all at uniform routing (data dependent): on the critical path";
  return g;
}

void zero_group(GroupTraffic& g, const ZeroGroupTraffic& z, int stage, int64_t m, int64_t last_unit_bytes) {
  g.payload.bytes[size_t(CommKind::AllReduce)] += z.all_reduce;
  g.payload.bytes[size_t(CommKind::ReduceScatter)] += z.reduce_scatter;
  g.payload.bytes[size_t(CommKind::AllGather)] += z.all_gather;
  g.payload.calls[size_t(CommKind::AllReduce)] += z.all_reduce_calls;
  g.payload.calls[size_t(CommKind::ReduceScatter)] += z.reduce_scatter_calls;
  g.payload.calls[size_t(CommKind::AllGather)] += z.all_gather_calls;
  const double f = ring(z.size);
  g.wire_bytes += z.wire_bytes();
  g.wire_overlap += 2 * f * double(z.all_reduce) + f * double(z.reduce_scatter) +
                    f * double(z.all_gather_forward + z.all_gather_backward);
  g.wire_after_step += stage == 1 || stage == 2 ? f * double(z.all_gather) : 0;
  g.wire_last_bucket = std::max(g.wire_last_bucket, (stage == 0 ? 2 : 1) * f * double(last_unit_bytes));
  g.reductions = stage >= 2 ? m : 1;
}

}  // namespace

StepTraffic step_traffic(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                         int64_t micro_batches) {
  const ModelDims g = make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
  const int chunks = pipeline_chunks(c);
  const std::vector<int64_t> layers = stage_layers_for(c, g, mesh.pp * chunks);
  const std::vector<ShardingPlan> plans =
      chunk_plans(g, c.model.init_std, mesh, at, c.parallel.zero_stage, c.parallel.sp, layers, chunks);
  return step_traffic(c, mesh, at.pp, micro_batches, plans, schedule_for(c, mesh.pp, micro_batches));
}

StepTraffic step_traffic(const Config& c, const MeshShape& mesh, int pp_rank, int64_t micro_batches,
                         const std::vector<ShardingPlan>& plans, const Schedule& s) {
  const int64_t m = micro_batches;
  const int stage = c.parallel.zero_stage;
  StepTraffic t;
  t.groups.push_back(tp_group(plans, m));
  t.groups.push_back(cp_group(plans, m));
  t.groups.push_back(ep_group(plans, m));

  GroupTraffic dense, expert;
  dense.label = "dp_cp";
  dense.size = mesh.dp * mesh.cp;
  expert.label = "edp";
  expert.size = mesh.edp();
  for (const ShardingPlan& p : plans) {
    const ZeroTraffic z = zero_traffic(p, stage, m);
    // Backward reduces the units in reverse: the embedding (or the first
    // layer of a later stage) is the last one, with nothing left to hide it.
    int64_t last_dense = 0, last_expert = 0;
    for (const UnitLayout& u : p.units) {
      if (u.bytes == 0) continue;
      int64_t& last = u.group == GradGroup::Edp ? last_expert : last_dense;
      if (last == 0) last = int64_t(u.bytes);
    }
    zero_group(dense, z.dense, stage, m, last_dense);
    zero_group(expert, z.expert, stage, m, last_expert);
  }
  dense.note = stage == 0 ? "all-reduce of the gradients, unit by unit in the last micro-batch's backward"
               : stage == 1 ? "reduce-scatter in the last micro-batch's backward, all-gather after the step"
               : stage == 2 ? "reduce-scatter every micro-batch's backward, all-gather after the step"
                            : "reduce-scatter every micro-batch, weights gathered before forward and backward";
  expert.note = dense.note + " (expert units)";
  t.groups.push_back(dense);
  if (expert.payload.of(CommKind::AllReduce) + expert.payload.of(CommKind::ReduceScatter) +
          expert.payload.of(CommKind::AllGather) > 0)
    t.groups.push_back(expert);

  GroupTraffic pp;
  pp.label = "pp";
  pp.size = mesh.pp;
  if (mesh.pp > 1) {
    const ModelDims& d = plans.front().local;
    const int64_t act = d.rows() * d.C * int64_t(dtype_size(d.act));
    // Every micro-batch makes the same transfers: count them on the
    // schedule given (which may be a shorter one of the same kind).
    int64_t sends = 0, recvs = 0;
    for (const Action& a : s.ranks[size_t(pp_rank)]) {
      if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGradient) ++sends;
      if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGradient) ++recvs;
    }
    for (int64_t k = 0; k < sends / s.microbatches * m; ++k) pp.payload.add(CommKind::Send, act);
    for (int64_t k = 0; k < recvs / s.microbatches * m; ++k) pp.payload.add(CommKind::Recv, act);
    // A tied table on the first and the last stage: its gradient goes both ways once per step.
    for (const ShardingPlan& p : plans)
      for (size_t i = 0; i < p.params.size(); ++i)
        if (p.placement[i].tie_sum && stage <= 1) {
          pp.payload.add(CommKind::Send, p.params[i].spec.bytes());
          pp.payload.add(CommKind::Recv, p.params[i].spec.bytes());
        }
    pp.wire_bytes = pp.wire_critical = double(pp.payload.of(CommKind::Send));
    pp.note = "activations forward, gradients backward, per micro-batch and stage boundary: exposed";
  }
  t.groups.push_back(pp);
  return t;
}

}  // namespace trainer
