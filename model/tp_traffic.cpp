#include "model/tp_traffic.h"

#include <cstdio>

namespace trainer {

const char* tp_op_name(TpOp op) {
  switch (op) {
    case TpOp::AllReduce: return "all_reduce";
    case TpOp::AllGather: return "all_gather";
    case TpOp::ReduceScatter: return "reduce_scatter";
  }
  return "?";
}

int64_t TpTraffic::payload(TpOp op) const {
  int64_t b = 0;
  for (const TpCollective& c : collectives)
    if (c.op == op) b += c.payload * c.calls;
  return b;
}

int64_t TpTraffic::wire_bytes_per_rank() const {
  if (tp <= 1) return 0;
  return (2 * (tp - 1) * payload(TpOp::AllReduce) +
          (tp - 1) * (payload(TpOp::AllGather) + payload(TpOp::ReduceScatter))) /
         tp;
}

namespace {

// Adds `calls` calls of a call site, merged with an equal site already listed.
void add_calls(TpTraffic& t, const std::string& where, TpOp op, int64_t payload, int64_t calls) {
  for (TpCollective& c : t.collectives)
    if (c.where == where && c.op == op && c.payload == payload) {
      c.calls += calls;
      return;
    }
  t.collectives.push_back({where, op, payload, calls});
}

}  // namespace

TpTraffic tp_traffic(const ShardingPlan& plan, int64_t micro_batches) {
  const ModelDims& d = plan.local;
  TpTraffic t;
  t.tp = d.tp;
  if (d.tp <= 1) return t;
  const int64_t tokens = d.N() * d.C * int64_t(dtype_size(d.act));  // one [N, C] activation
  auto add = [&](const std::string& where, TpOp op, int64_t payload, int64_t per_mb) {
    add_calls(t, where, op, payload, per_mb * micro_batches);
  };
  // The two regions of a column-parallel input and a row-parallel output
  // (model/tensor_parallel.h), forward and backward.
  // Under sp the norm output is kept at this rank's rows and gathered again
  // for the weight gradients (model/tensor_parallel.h).
  auto column_input = [&](const std::string& what, int64_t n) {
    if (d.sp) add(what + " forward: column input all-gather", TpOp::AllGather, tokens, n);
    add(what + " backward: column input gradient", d.sp ? TpOp::ReduceScatter : TpOp::AllReduce, tokens, n);
    if (d.sp) add(what + " backward: column input all-gather again (weight gradients)", TpOp::AllGather, tokens, n);
  };
  auto row_output = [&](const std::string& what, int64_t n) {
    add(what + " forward: row output", d.sp ? TpOp::ReduceScatter : TpOp::AllReduce, tokens, n);
    if (d.sp) add(what + " backward: row output gradient all-gather", TpOp::AllGather, tokens, n);
  };
  if (d.has_embedding) row_output("embedding", 1);
  int64_t dense = 0, moe = 0;
  for (int64_t i = 0; i < d.L; ++i) (d.moe_layer(i) ? moe : dense) += 1;
  column_input("attention", d.L);
  row_output("attention", d.L);
  if (dense) {
    column_input("mlp", dense);
    row_output("mlp", dense);
  }
  if (moe) {
    column_input("moe", moe);
    row_output("moe", moe);
    add("moe backward: combine weight gradient [N, K] F32", TpOp::AllReduce, d.N() * d.K * 4, moe);
  }
  // Activation recompute (model/recompute.h) runs forward collectives again
  // in the backward: full every one of the block's; selective none (the norm
  // outputs it rebuilds are this rank's rows, which the backward gathers
  // anyway).
  int64_t full_dense = 0, full_moe = 0;
  for (int64_t i = 0; i < d.L; ++i)
    if (d.recompute_of(i) == Recompute::Full) (d.moe_layer(i) ? full_moe : full_dense) += 1;
  auto forward_again = [&](const std::string& what, int64_t n) {
    if (n == 0) return;
    if (d.sp) add(what + " recompute: column input all-gather", TpOp::AllGather, tokens, n);
    add(what + " recompute: row output", d.sp ? TpOp::ReduceScatter : TpOp::AllReduce, tokens, n);
  };
  forward_again("attention", full_dense + full_moe);
  forward_again("mlp", full_dense);
  forward_again("moe", full_moe);
  if (d.has_head) {
    column_input("head", 1);
    add("head forward: cross-entropy statistics [tp, N, 3] F32", TpOp::AllGather, int64_t(d.tp) * d.N() * 3 * 4, 1);
  }
  // Partial weight gradients completed over tp ranks, once per reduction:
  // the norms under sequence parallelism, replicated kv heads (an all-gather
  // of every rank's part).
  const int64_t reductions = plan.zero_stage >= 2 ? micro_batches : 1;
  auto add_step = [&](const std::string& where, TpOp op, int64_t payload) {
    add_calls(t, where, op, payload, reductions);
  };
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const int64_t bytes = plan.params[i].spec.bytes();
    if (plan.placement[i].tp_sum) add_step("optimizer: norm weight gradient sums (sp)", TpOp::AllReduce, bytes);
    if (plan.placement[i].kv_replicas > 1)
      add_step("optimizer: replicated kv head gradients", TpOp::AllGather, bytes * d.tp);
  }
  return t;
}

TpTraffic tp_traffic(const std::vector<ShardingPlan>& chunks, int64_t micro_batches) {
  TpTraffic all;
  for (const ShardingPlan& plan : chunks) {
    const TpTraffic t = tp_traffic(plan, micro_batches);
    all.tp = t.tp;
    for (const TpCollective& c : t.collectives) add_calls(all, c.where, c.op, c.payload, c.calls);
  }
  return all;
}

std::string format_tp_traffic(const TpTraffic& t) {
  if (t.tp <= 1) return "";
  std::string s = "tensor-parallel collectives per step (tp " + std::to_string(t.tp) +
                  "; ring bytes per rank: all_reduce 2(p-1)/p x payload, all_gather and reduce_scatter (p-1)/p x payload):\n";
  char buf[256];
  for (const TpCollective& c : t.collectives) {
    std::snprintf(buf, sizeof buf, "  %-58s %-14s %10.1f KiB x %lld\n", c.where.c_str(), tp_op_name(c.op),
                  double(c.payload) / 1024.0, (long long)c.calls);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, "  payload per step: all_reduce %.1f KiB, all_gather %.1f KiB, reduce_scatter %.1f KiB; "
                "sent per rank %.1f KiB\n",
                double(t.payload(TpOp::AllReduce)) / 1024.0, double(t.payload(TpOp::AllGather)) / 1024.0,
                double(t.payload(TpOp::ReduceScatter)) / 1024.0, double(t.wire_bytes_per_rank()) / 1024.0);
  return s + buf;
}

}  // namespace trainer
