#include "observe/link_report.h"

#include <cstdio>
#include <set>

namespace trainer {

namespace {

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, s < 0.01 ? "%.3f ms" : "%.1f ms", 1e3 * s);
  return b;
}

std::string whole(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string bytes_text(double b) { return whole(b) + " B"; }

// Where the members of rank's group on `label` run: "" when the label is
// not an axis of the mesh.
std::set<std::string> hosts_of_group(const MeshShape& mesh, int rank, const std::string& label,
                                     const std::vector<std::string>& host_of_rank) {
  std::set<std::string> out;
  for (Axis a : kAllAxes) {
    if (label != axis_name(a)) continue;
    for (int r : group_ranks(mesh, rank, a))
      if (r >= 0 && r < int(host_of_rank.size())) out.insert(host_of_rank[size_t(r)]);
  }
  return out;
}

// The planner's group of this rank's pipeline stage.
const GroupTime* predicted_group(const StepEstimate* e, int stage, const std::string& label) {
  if (!e || stage >= int(e->stage_groups.size())) return nullptr;
  for (const GroupTime& g : e->stage_groups[size_t(stage)])
    if (g.label == label) return &g;
  return nullptr;
}

// The schedule simulated on the entry's compute and link: the pipeline
// idle the run's per-stage report measures, in the same units.
std::string bubble_note(const StepEstimate& e) {
  if (e.pipeline_s <= 0 || e.bubble <= 0) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, "; pipeline bubble %.1f%% of the simulated schedule, links included",
                100.0 * e.bubble);
  return buf;
}

}  // namespace

std::string format_link_report(const MeshShape& mesh, int rank, const std::vector<std::string>& host_of_rank,
                               const std::vector<LinkUse>& measured, const StepEstimate* predicted,
                               const Hardware* hw, std::string* json) {
  std::set<std::string> nodes(host_of_rank.begin(), host_of_rank.end());
  const int stage = coords_of(mesh, rank).pp;
  std::string line, plan, js = "{\"links_per_step\": {";
  bool first = true;
  for (const LinkUse& u : measured) {
    // A group of one rank, or one the layout never uses (edp of a dense model).
    if (u.size <= 1 || (u.bytes == 0 && !predicted_group(predicted, stage, u.label))) continue;
    const std::set<std::string> hosts = hosts_of_group(mesh, rank, u.label, host_of_rank);
    const bool across = hosts.size() > 1;
    line += std::string(first ? "" : "; ") + u.label + (across ? " across nodes: " : " inside node " +
                                                                                          (hosts.empty() ? std::string("?") : *hosts.begin()) + ": ") +
            bytes_text(u.bytes) + " in " + ms(u.seconds);
    if (across && u.seconds > 0) {
      char b[48];
      std::snprintf(b, sizeof b, " (%.1f MB/s)", u.bytes / u.seconds / 1e6);
      line += b;
    }
    js += std::string(first ? "" : ", ") + "\"" + u.label + "\": {\"across_nodes\": " + (across ? "true" : "false") +
          ", \"bytes\": " + whole(u.bytes) +
          ", \"ms\": " + std::to_string(1e3 * u.seconds);
    if (const GroupTime* g = predicted_group(predicted, stage, u.label)) {
      plan += std::string(plan.empty() ? "" : "; ") + u.label + " " + bytes_text(g->payload) + " in " + ms(g->seconds);
      js += ", \"planned_bytes\": " + whole(g->payload) +
            ", \"planned_ms\": " + std::to_string(1e3 * g->seconds);
    }
    js += "}";
    first = false;
  }
  if (first) return "";
  if (json) *json = js + "}}";
  std::string out = "links per step, rank " + std::to_string(rank) + " (" + std::to_string(nodes.size()) +
                    (nodes.size() == 1 ? " node): " : " nodes): ") + line + "\n";
  if (predicted && hw) {
    char head[256];
    std::snprintf(head, sizeof head,
                  "links per step, planner on hardware '%s' (in-node %.3g GB/s, network %.3g Gbit/s per rank, "
                  "%d per node): ",
                  hw->name.c_str(), hw->nvlink_gb_s, hw->network_gbit_s, hw->gpus_per_node);
    out += head + (plan.empty() ? std::string("no group of these") : plan) + "\n";
  }
  return out;
}

std::string format_step_model(const StepEstimate& e, const Hardware& hw, double measured_s, int64_t steps,
                              std::string* json) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "step time model on hardware '%s': predicted %.1f ms (compute %.1f + exposed communication %.1f + "
                "idle %.1f + optimizer %.1f); measured %.1f ms per step (rank 0, mean of %lld steps)%s\n",
                hw.name.c_str(), 1e3 * e.step_s, 1e3 * e.compute_s, 1e3 * e.exposed_comm_s, 1e3 * e.idle_s,
                1e3 * e.optimizer_s, 1e3 * measured_s, (long long)steps, bubble_note(e).c_str());
  if (json) {
    // Each stage's idle in the simulated schedule, beside the bubble.
    std::string stages;
    char num[32];
    for (size_t i = 0; i < e.stage_idle_s.size(); ++i) {
      std::snprintf(num, sizeof num, "%s%.4f", i ? ", " : "", 1e3 * e.stage_idle_s[i]);
      stages += num;
    }
    char js[640];
    std::snprintf(js, sizeof js,
                  "{\"step_model\": {\"predicted_ms\": %.4f, \"compute_ms\": %.4f, \"exposed_ms\": %.4f, "
                  "\"idle_ms\": %.4f, \"optimizer_ms\": %.4f, \"measured_ms\": %.4f, \"steps\": %lld, "
                  "\"pipeline_bubble\": %.4f, \"pipeline_ms\": %.4f, \"pipeline_idle_ms\": [%s]}}",
                  1e3 * e.step_s, 1e3 * e.compute_s, 1e3 * e.exposed_comm_s, 1e3 * e.idle_s, 1e3 * e.optimizer_s,
                  1e3 * measured_s, (long long)steps, e.bubble, 1e3 * e.pipeline_s, stages.c_str());
    *json = js;
  }
  return buf;
}

}  // namespace trainer
