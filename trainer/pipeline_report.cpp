#include "trainer/pipeline_report.h"

#include <cstdio>

#include "pipeline/stage_split.h"
#include "trainer/plan.h"

namespace trainer {

std::string format_pipeline(const Config& c, const ModelDims& global, const std::vector<int64_t>& layers,
                            const Schedule& s, const Simulation& sim, DType storage, const MeshShape& mesh) {
  const std::vector<double> flops = stage_flops(global, layers);
  double total = 0;
  for (double f : flops) total += f;
  char buf[256];
  std::snprintf(buf, sizeof buf, "pipeline: %d stages, %s, %d micro-batches per step, layers %s%s\n", s.stages,
                schedule_name(s.kind), s.microbatches, format_layers(layers).c_str(),
                c.parallel.pp_layers.empty() ? " (balanced by the cost model)" : " (parallel.pp_layers)");
  std::string out = buf;
  int64_t first = 0;
  for (int st = 0; st < s.stages; ++st) {
    Coords at;
    at.pp = st;
    const MemoryPlan mp = plan_memory(c, storage, mesh, at, c.parallel.zero_stage);
    std::snprintf(buf, sizeof buf,
                  "  stage %d: layers %lld-%lld%s%s, %.1f%% of the forward FLOPs, %d micro-batch%s in flight, %s per rank\n",
                  st, (long long)first, (long long)(first + layers[size_t(st)] - 1), st == 0 ? " + embedding" : "",
                  st + 1 == s.stages ? " + head and loss" : "", 100.0 * flops[size_t(st)] / total,
                  sim.peak_slots[size_t(st)], sim.peak_slots[size_t(st)] == 1 ? "" : "es",
                  format_bytes(double(mp.total())).c_str());
    out += buf;
    first += layers[size_t(st)];
  }
  std::snprintf(buf, sizeof buf,
                "  bubble: (p-1)/(m+p-1) = %.1f%% with equal stages; simulated with these stage costs: %.1f%%\n",
                100.0 * theoretical_bubble(s.stages, s.microbatches), 100.0 * sim.bubble());
  return out + buf;
}

std::string format_pipeline_idle(const MeshShape& mesh, const std::vector<double>& idle, const Simulation& sim) {
  std::string out = "  pipeline idle (waiting for neighbours) per stage:";
  char buf[64];
  for (int st = 0; st < mesh.pp; ++st) {
    double sum = 0;
    int n = 0;
    for (int r = 0; r < int(idle.size()); ++r)
      if (coords_of(mesh, r).pp == st) {
        sum += idle[size_t(r)];
        ++n;
      }
    std::snprintf(buf, sizeof buf, " %d: %.0f%%", st, 100.0 * sum / double(n > 0 ? n : 1));
    out += buf;
  }
  std::snprintf(buf, sizeof buf, " (simulated bubble %.0f%%)\n", 100.0 * sim.bubble());
  return out + buf;
}

}  // namespace trainer
