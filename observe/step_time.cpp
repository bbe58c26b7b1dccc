#include "observe/step_time.h"

#include <cstdio>

#include "planner/hardware.h"

namespace trainer {

double StepTime::comm_total() const {
  double s = 0;
  for (const auto& [g, t] : comm) s += t;
  return s;
}

double StepTime::named() const { return data + forward + backward + optimizer + checkpoint + eval + comm_total(); }

namespace {

// Adds to the group's entry, appending it the first time (first-seen order).
void add_to(std::vector<std::pair<std::string, double>>& per_group, const std::string& group, double seconds) {
  for (auto& [g, t] : per_group)
    if (g == group) {
      t += seconds;
      return;
    }
  per_group.emplace_back(group, seconds);
}

}  // namespace

void StepTime::add_comm(const std::string& group, double seconds) { add_to(comm, group, seconds); }

void StepTime::add_busy(const std::string& group, double seconds) { add_to(busy, group, seconds); }

StepTime& StepTime::operator+=(const StepTime& o) {
  data += o.data;
  forward += o.forward;
  backward += o.backward;
  optimizer += o.optimizer;
  checkpoint += o.checkpoint;
  eval += o.eval;
  other += o.other;
  for (const auto& [g, t] : o.comm) add_comm(g, t);
  for (const auto& [g, t] : o.busy) add_busy(g, t);
  return *this;
}

StepTime per_step(StepTime w, double wall, int64_t steps) {
  w.other = wall - w.named();
  const double k = steps > 0 ? 1.0 / double(steps) : 0;
  for (double* x : {&w.data, &w.forward, &w.backward, &w.optimizer, &w.checkpoint, &w.eval, &w.other}) *x *= k;
  for (auto& [g, t] : w.comm) t *= k;
  for (auto& [g, t] : w.busy) t *= k;
  return w;
}

std::string step_time_json(const StepTime& t) {
  char buf[64];
  std::string s = "\"time_ms\": {";
  auto put = [&](const std::string& name, double v, bool first = false) {
    std::snprintf(buf, sizeof buf, "%.4f", 1e3 * v);
    s += (first ? "\"" : ", \"") + name + "\": " + buf;
  };
  put("data", t.data, true);
  put("forward", t.forward);
  put("backward", t.backward);
  put("optimizer", t.optimizer);
  put("checkpoint", t.checkpoint);
  put("eval", t.eval);
  for (const auto& [g, v] : t.comm) put("comm_" + g, v);
  put("other", t.other);
  s += "}, \"comm_busy_ms\": {";
  for (size_t i = 0; i < t.busy.size(); ++i) put(t.busy[i].first, t.busy[i].second, i == 0);
  return s + "}";
}

std::string format_step_time(const StepTime& total, double wall, int64_t steps) {
  const StepTime t = per_step(total, wall, steps);
  const double step = wall / double(steps > 0 ? steps : 1);
  std::string out = "where the time went (rank 0, " + std::to_string(steps) + " steps, ms per step):\n";
  char buf[160];
  auto row = [&](const std::string& name, double v) {
    std::snprintf(buf, sizeof buf, "  %-26s %9.2f  %5.1f%%\n", name.c_str(), 1e3 * v, step > 0 ? 100 * v / step : 0);
    out += buf;
  };
  row("forward (compute)", t.forward);
  row("backward (compute)", t.backward);
  row("optimizer", t.optimizer);
  row("data wait", t.data);
  for (const auto& [g, v] : t.comm)
    if (v > 0) row(g == "pp" ? "pipeline idle (pp)" : "communication " + g, v);
  row("checkpoint stall", t.checkpoint);
  row("evaluation", t.eval);
  row("other", t.other);
  row("step", step);
  // Overlap, measured: of each group's communication, what the rank waited
  // for and what ran while it computed.
  std::string hidden;
  for (const auto& [g, b] : t.busy) {
    double exposed = 0;
    for (const auto& [h, v] : t.comm)
      if (h == g) exposed = v;
    if (b <= 0) continue;
    std::snprintf(buf, sizeof buf, "  %-10s exposed %9.2f of busy %9.2f ms per step, %5.1f%% hidden\n", g.c_str(),
                  1e3 * exposed, 1e3 * b, 100 * std::max(0.0, b - exposed) / b);
    hidden += buf;
  }
  if (!hidden.empty())
    out += "communication exposed (rank 0 waited) of busy (the group's collectives ran), per group:\n" + hidden;
  return out;
}

std::vector<std::pair<std::string, double>> step_time_scalars(const StepTime& t) {
  std::vector<std::pair<std::string, double>> out = {
      {"time/forward_ms", 1e3 * t.forward},     {"time/backward_ms", 1e3 * t.backward},
      {"time/optimizer_ms", 1e3 * t.optimizer}, {"time/data_ms", 1e3 * t.data},
      {"time/checkpoint_ms", 1e3 * t.checkpoint}, {"time/other_ms", 1e3 * t.other}};
  for (const auto& [g, v] : t.comm) out.emplace_back("comm/" + g + "_exposed_ms", 1e3 * v);
  for (const auto& [g, v] : t.busy) out.emplace_back("comm/" + g + "_busy_ms", 1e3 * v);
  return out;
}

double peak_tflops(const std::string& line, bool low_precision, double configured) {
  if (configured > 0) return configured;
  // The dense tensor-core peaks of planner/hardware.cpp's table (bf16/fp16;
  // fp32 runs on TF32 at half that).
  const Hardware* g = gpu_of_device_line(line);
  if (!g) return 0;
  return low_precision ? g->bf16_tflops : g->bf16_tflops / 2;
}

}  // namespace trainer
