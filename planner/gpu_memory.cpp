#include "planner/gpu_memory.h"

#include <algorithm>

#include "model/sharding.h"

namespace trainer {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}

GpuMemory gpu_memory_of(const Config& c, const MeshShape& mesh, const Hardware& hw) {
  return gpu_memory_of(mesh, hw, layout_shardings(c, mesh, kGpuStorage), c.parallel.zero_stage,
                       c.optim.offload == "optimizer");
}

GpuMemory gpu_memory_of(const MeshShape& mesh, const Hardware& hw, const LayoutShardings& lp, int zero_stage,
                        bool offload) {
  GpuMemory out;
  out.device = hw.memory_gib * kGiB;
  for (int st = 0; st < mesh.pp; ++st) {
    const std::vector<ShardingPlan>& plans = lp.plans(st);
    MemoryPlan p = memory_of_plans(plans, lp.slots_of(st), mesh, zero_stage, offload);
    if (size_t(st) < lp.in_flight.size()) p.in_flight = std::min(p.activation_slots, lp.in_flight[size_t(st)]);
    // Allocated by ZeroOptimizer on first use: every tp rank's part of a
    // replicated kv head's gradient, the other pipeline end's tied table.
    size_t extra = 0;
    for (const ShardingPlan& plan : plans)
      for (size_t i = 0; i < plan.params.size(); ++i) {
        const size_t b = plan.params[i].spec.bytes();
        if (plan.placement[i].kv_replicas > 1) extra = std::max(extra, size_t(mesh.tp) * b);
        if (plan.placement[i].tie_sum && mesh.pp > 1) extra += b;
      }
    if (st == 0 || p.total() + extra > out.total()) {
      out.ledger = p;
      out.stage = st;
      out.comm_buffers = extra;
    }
  }
  return out;
}

std::string fitting_levers(const Config& c, const MeshShape& mesh, const Hardware& hw) {
  std::vector<std::pair<std::string, Config>> tries;
  for (int z = c.parallel.zero_stage + 1; z <= 3; ++z) {
    Config t = c;
    t.parallel.zero_stage = z;
    tries.push_back({"parallel.zero_stage=" + std::to_string(z), t});
  }
  for (const char* r : {"selective", "full"}) {
    if (c.train.recompute == r || (c.train.recompute == "full")) continue;
    Config t = c;
    t.train.recompute = r;
    tries.push_back({std::string("train.recompute=") + r, t});
  }
  if (c.optim.offload == "none") {
    Config t = c;
    t.optim.offload = "optimizer";
    tries.push_back({"optim.offload=optimizer", t});
  }
  for (int mb = c.train.micro_batch_size / 2; mb >= 1; mb /= 2) {
    Config t = c;
    t.train.micro_batch_size = mb;
    tries.push_back({"train.micro_batch_size=" + std::to_string(mb), t});
    if (gpu_memory_of(t, mesh, hw).fits()) break;
  }
  std::string out;
  for (const auto& [what, t] : tries) {
    try {
      validate_config(t, mesh.world());
      const GpuMemory m = gpu_memory_of(t, mesh, hw);
      const std::string host = m.ledger.offload ? "; " + format_bytes(double(m.ledger.host_bytes)) +
                                                      " of host memory per rank"
                                                : "";
      if (m.fits()) out += (out.empty() ? "" : ", ") + what + " (" + format_bytes(double(m.total())) + host + ")";
    } catch (const ConfigError&) {
      // Not a legal layout with this change (ZeRO-2/3 with a pipeline...).
    }
  }
  return out;
}

}  // namespace trainer
