#include "observe/context_report.h"

#include <cstdio>

#include "model/activations.h"
#include "model/cp_traffic.h"
#include "planner/memory_plan.h"

namespace trainer {

std::string format_context_report(const ShardingPlan& plan, int64_t microbatches) {
  const ModelDims& d = plan.local;
  const RingTraffic t = ring_traffic(d);
  const double acts = double(arena_bytes(activation_specs(d)));
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "context parallel %d: %lld of %lld tokens of every sequence per rank (chunks %d and %d of %d), "
                "activations %s per micro-batch (1/%d of the sequence's)\n"
                "  ring per attention layer and micro-batch: %s forward, %s backward leaving each rank; %s per step "
                "over %lld layer%s and %lld micro-batch%s\n",
                d.cp, (long long)d.T, (long long)(d.T * d.cp), d.cp_rank, 2 * d.cp - 1 - d.cp_rank, 2 * d.cp,
                format_bytes(acts).c_str(), d.cp, format_bytes(t.forward_bytes).c_str(),
                format_bytes(t.backward_bytes).c_str(),
                format_bytes((t.forward_bytes + t.backward_bytes) * double(d.L) * double(microbatches)).c_str(),
                (long long)d.L, d.L == 1 ? "" : "s", (long long)microbatches, microbatches == 1 ? "" : "es");
  return buf;
}

}  // namespace trainer
