#include "observe/pipeline_report.h"

#include <algorithm>
#include <cstdio>

#include "pipeline/stage_split.h"
#include "planner/memory_plan.h"

namespace trainer {

std::string format_pipeline(const Config& c, const ModelDims& global, const std::vector<int64_t>& layers,
                            const Schedule& s, const Simulation& sim, DType storage, const MeshShape& mesh) {
  const std::vector<double> flops = stage_flops(global, layers);
  double total = 0;
  for (double f : flops) total += f;
  const int V = s.virtual_stages();
  char buf[640];
  std::snprintf(buf, sizeof buf, "pipeline: %d stages%s, %s, %d micro-batches per step, layers %s%s\n", s.stages,
                s.chunks > 1 ? (" x " + std::to_string(s.chunks) + " chunks").c_str() : "", schedule_name(s.kind),
                s.microbatches, format_layers(layers).c_str(),
                c.parallel.pp_layers.empty() ? " (balanced by the cost model)" : " (parallel.pp_layers)");
  std::string out = buf;
  std::vector<int64_t> first(size_t(V) + 1, 0);
  for (int k = 0; k < V; ++k) first[size_t(k) + 1] = first[size_t(k)] + layers[size_t(k)];
  for (int st = 0; st < s.stages; ++st) {
    Coords at;
    at.pp = st;
    const MemoryPlan mp = plan_memory(c, storage, mesh, at, c.parallel.zero_stage);
    std::string held;
    double share = 0;
    for (int k = st; k < V; k += s.stages) {
      if (!held.empty()) held += ", ";
      held += std::to_string(first[size_t(k)]) + "-" + std::to_string(first[size_t(k) + 1] - 1);
      share += flops[size_t(k)];
    }
    std::snprintf(buf, sizeof buf,
                  "  stage %d: layers %s%s%s, %.1f%% of the forward FLOPs, activations of %s, %s per rank\n", st,
                  held.c_str(), st == 0 ? " + embedding" : "", st == (V - 1) % s.stages ? " + head and loss" : "",
                  100.0 * share / total, describe_slots(mp).c_str(), format_bytes(double(mp.total())).c_str());
    out += buf;
  }
  const TextbookBubble textbook = textbook_bubble(s);
  std::snprintf(buf, sizeof buf, "  bubble: %s = %.1f%% with equal stages; simulated with these stage costs: %.1f%%\n",
                textbook.formula, 100.0 * textbook.value, 100.0 * sim.bubble());
  return out + buf;
}

namespace {

std::vector<double> stage_means(const MeshShape& mesh, const std::vector<double>& idle) {
  std::vector<double> sum(size_t(mesh.pp), 0);
  std::vector<int> n(size_t(mesh.pp), 0);
  for (int r = 0; r < int(idle.size()); ++r) {
    const int st = coords_of(mesh, r).pp;
    sum[size_t(st)] += idle[size_t(r)];
    ++n[size_t(st)];
  }
  for (size_t st = 0; st < sum.size(); ++st) sum[st] /= double(std::max(1, n[st]));
  return sum;
}

}  // namespace

std::string format_pipeline_idle(const MeshShape& mesh, const std::vector<double>& idle, const Simulation& sim) {
  std::string out = "  pipeline idle (waiting for neighbours) per stage:";
  char buf[64];
  const std::vector<double> per_stage = stage_means(mesh, idle);
  for (int st = 0; st < mesh.pp; ++st) {
    std::snprintf(buf, sizeof buf, " %d: %.0f%%", st, 100.0 * per_stage[size_t(st)]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, " (simulated bubble %.0f%%)\n", 100.0 * sim.bubble());
  return out + buf;
}

std::string pipeline_idle_json(int64_t step, const MeshShape& mesh, const std::vector<double>& idle,
                               const Simulation& sim) {
  std::string out = "{\"step\": " + std::to_string(step) + ", \"pipeline_idle\": [";
  char buf[32];
  const std::vector<double> per_stage = stage_means(mesh, idle);
  for (size_t st = 0; st < per_stage.size(); ++st) {
    std::snprintf(buf, sizeof buf, "%s%.4f", st ? ", " : "", per_stage[st]);
    out += buf;
  }
  std::snprintf(buf, sizeof buf, "], \"simulated_bubble\": %.4f}", sim.bubble());
  return out + buf;
}

}  // namespace trainer
