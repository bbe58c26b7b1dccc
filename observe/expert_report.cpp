#include "observe/expert_report.h"

#include <cstdio>

#include "planner/memory_plan.h"

namespace trainer {

ExpertLayout expert_layout(const std::vector<ShardingPlan>& chunks) {
  ExpertLayout p;
  for (const ShardingPlan& c : chunks) {
    const ModelDims& d = c.local;
    p.ep = c.mesh.ep;
    p.edp = c.mesh.edp();
    p.experts = d.E;
    p.experts_here = d.experts_here();
    for (const UnitLayout& u : c.units) (u.kind == UnitKind::Experts ? p.expert_bytes : p.dense_bytes) += u.bytes;
    for (int64_t i = 0; i < d.L; ++i) p.moe_layers += d.moe_layer(i) ? 1 : 0;
    const double rows = double(d.N() * d.K) * double(p.ep - 1) / double(p.ep);
    p.all_to_all_bytes = 4 * rows * double(d.C) * double(dtype_size(d.act));
  }
  return p;
}

std::string format_expert_layout(const ExpertLayout& p, int64_t microbatches) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "expert parallel %d: %lld of %lld experts per rank, their gradients summed over expert data parallel "
                "%d; expert weights %s per rank (dense %s)\n"
                "  all-to-all per MoE layer and micro-batch: %s leaving each rank with uniform routing (dispatch and "
                "combine, forward and backward); %s per step over %lld MoE layer%s and %lld micro-batch%s\n",
                p.ep, (long long)p.experts_here, (long long)p.experts, p.edp, format_bytes(double(p.expert_bytes)).c_str(),
                format_bytes(double(p.dense_bytes)).c_str(), format_bytes(p.all_to_all_bytes).c_str(),
                format_bytes(p.all_to_all_bytes * double(p.moe_layers) * double(microbatches)).c_str(),
                (long long)p.moe_layers, p.moe_layers == 1 ? "" : "s", (long long)microbatches,
                microbatches == 1 ? "" : "es");
  return buf;
}

std::string format_moe_routing(const ModelDims& d, double capacity_factor, int dp) {
  const long long B = (long long)d.B, T = (long long)(d.T * d.cp);
  std::string s = "moe routing: " + std::to_string(d.E) + " experts, top-" + std::to_string(d.K) + ", ";
  char buf[384];
  if (d.capacity > 0)
    std::snprintf(buf, sizeof buf,
                  "capacity %lld rows per expert per micro-batch (capacity_factor %g x %lld x %lld tokens x %lld / "
                  "%lld, first choices first; the rest dropped)",
                  (long long)d.capacity, capacity_factor, B, T, (long long)d.K, (long long)d.E);
  else
    std::snprintf(buf, sizeof buf, "dropless");
  s += buf;
  s += "; capacity and load-balancing statistics over each micro-batch's " + std::to_string(B) +
       " whole sequences";
  if (d.cp > 1) s += " (summed and admitted across the " + std::to_string(d.cp) + " cp ranks)";
  if (dp > 1)
    s += "; each of the " + std::to_string(dp) +
         " data-parallel ranks routes its own micro-batches, as one process with this micro_batch_size";
  return s + "\n";
}

}  // namespace trainer
