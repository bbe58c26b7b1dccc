#include "calibrate/calibration_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "config/hardware_file.h"
#include "planner/collective_cost.h"

namespace trainer {

namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// Four significant digits: the file is read by people too, and the
// measurement is not better than that.
double round_sig(double v, int digits = 4) {
  if (v == 0 || !std::isfinite(v)) return v;
  const double scale = std::pow(10.0, digits - 1 - int(std::floor(std::log10(std::fabs(v)))));
  return std::round(v * scale) / scale;
}

// A latency of 0 in the section means "the table's"; a fitted zero is
// written as the smallest value the file shows instead.
double latency_us(double seconds) { return std::max(0.01, round_sig(1e6 * seconds, 3)); }

std::string size_text(double bytes) {
  if (bytes >= (1 << 20)) return fmt("%.0f MiB", bytes / (1 << 20));
  if (bytes >= 1024) return fmt("%.0f KiB", bytes / 1024);
  return fmt("%.0f B", bytes);
}

std::string ms(double s) { return fmt("%.3f ms", 1e3 * s); }
std::string pct(double e) { return fmt("%+.1f%%", 100 * e); }

const char* kind_text(CommKind k) { return k == CommKind::Send ? "send/recv" : comm_kind_name(k); }

// The section's values: compute from the slowest rank, links from the fit.
void fill_numbers(const Calibration& c, const PlannerLinks& f, CalibrationReport& r) {
  HardwareConfig& h = r.numbers.hardware;
  const double slowest = *std::min_element(c.rank_flop_per_s.begin(), c.rank_flop_per_s.end()) / 1e12;
  // A known GPU keeps its data-sheet peak and gets the efficiency the
  // model's matmuls reach; anything else states the rate itself as its peak.
  const bool peak = c.gpu && slowest <= c.gpu->bf16_tflops;
  h.gpu = c.gpu ? c.gpu->name : c.device == "cpu" ? "calibrated-cpu" : c.device;
  h.memory_gib = round_sig(c.memory_gib, 3);
  h.bf16_tflops = peak ? c.gpu->bf16_tflops : round_sig(slowest);
  h.matmul_efficiency = peak ? round_sig(slowest / c.gpu->bf16_tflops) : 1;
  h.gpus_per_node = c.gpus_per_node;
  r.keys = {"hardware.gpu", "hardware.memory_gib", "hardware.bf16_tflops", "hardware.matmul_efficiency",
            "hardware.gpus_per_node"};
  const Hardware fitted = with_links(Hardware{}, f);
  if (f.inside) {
    h.nvlink_gb_s = round_sig(fitted.nvlink_gb_s);
    h.nvlink_latency_us = latency_us(f.inside_step_latency);
    r.keys.insert(r.keys.end(), {"hardware.nvlink_gb_s", "hardware.nvlink_latency_us"});
  }
  if (f.across) {
    h.network_gbit_s = round_sig(fitted.network_gbit_s);
    h.network_latency_us = latency_us(f.across_step_latency);
    r.keys.insert(r.keys.end(), {"hardware.network_gbit_s", "hardware.network_latency_us"});
  }
  if (f.inside || f.across) {
    h.collective_latency_us = latency_us(f.collective_latency);
    r.keys.push_back("hardware.collective_latency_us");
  }
  // What `trainer plan` will make of the file (the numbers as written); a
  // link not measured gets a placeholder that nothing here prices.
  Config probe = r.numbers;
  if (probe.hardware.nvlink_gb_s <= 0) probe.hardware.nvlink_gb_s = 1;
  if (probe.hardware.network_gbit_s <= 0) probe.hardware.network_gbit_s = 1;
  r.hardware = resolve_hardware(probe);
}

// Every size of every collective: measured, the line's and the planner's time.
std::string link_table(const Calibration& c, CalibrationReport& r) {
  std::string out;
  char b[320];
  for (size_t i = 0; i < c.links.size(); ++i) {
    const CollectiveTimes& t = c.links[i];
    const LineFit line = fit_line(fitting_half(t.bytes), fitting_half(t.seconds));
    std::snprintf(b, sizeof b, "%s, %s (%d ranks): t(n) = %s + n / %.4g MB/s; the planner's bandwidth %.4g MB/s per rank\n",
                  c.link_labels[i].c_str(), kind_text(t.kind), t.ranks, ms(line.a).c_str(), line.B / 1e6,
                  line.B * wire_share(t.kind, t.ranks) / 1e6);
    out += b;
    for (size_t s = 0; s < t.bytes.size(); ++s) {
      const double planner = collective_seconds(t.kind, t.ranks, t.bytes[s], t.across_nodes, t.members_per_node, r.hardware);
      const bool held = s % 2 == 1;
      if (held) r.worst_held_out = std::max(r.worst_held_out, std::fabs(relative_error(planner, t.seconds[s])));
      std::snprintf(b, sizeof b, "  %-6s %-14s %8s  measured %10s  line %10s %7s  planner %10s %7s  %s\n",
                    t.across_nodes ? "across" : "inside", kind_text(t.kind), size_text(t.bytes[s]).c_str(),
                    ms(t.seconds[s]).c_str(), ms(line.at(t.bytes[s])).c_str(),
                    pct(relative_error(line.at(t.bytes[s]), t.seconds[s])).c_str(), ms(planner).c_str(),
                    pct(relative_error(planner, t.seconds[s])).c_str(), held ? "held out" : "fitted");
      out += b;
    }
  }
  return out;
}

std::string matmul_table(const Calibration& c) {
  std::string out = "matmuls of the model (TFLOP/s, forward and both backward products):";
  size_t slowest = 0;
  for (size_t r = 0; r < c.rank_flop_per_s.size(); ++r) {
    out += (r ? ", rank " : " rank ") + std::to_string(r) + " " + fmt("%.4g", c.rank_flop_per_s[r] / 1e12);
    if (c.rank_flop_per_s[r] < c.rank_flop_per_s[slowest]) slowest = r;
  }
  out += "; the slowest, rank " + std::to_string(slowest) + ", is bf16_tflops x matmul_efficiency\n";
  out += "rank 0's shapes (rows x in -> out, per micro-batch):\n";
  for (const MatmulTiming& m : c.matmuls) {
    char b[256];
    std::snprintf(b, sizeof b, "  %-24s %6lld x %6lld -> %6lld  x%-5g forward %s, backward %s + %s: %.4g TFLOP/s\n",
                  m.shape.name.c_str(), (long long)m.shape.rows, (long long)m.shape.in, (long long)m.shape.out,
                  m.shape.count, ms(m.forward_s).c_str(), ms(m.backward_input_s).c_str(),
                  ms(m.backward_weight_s).c_str(), m.flop_per_s() / 1e12);
    out += b;
  }
  return out;
}

std::string header(const Calibration& c) {
  std::string hosts;
  for (size_t r = 0; r < c.host_of_rank.size(); ++r) {
    if (r > 0 && c.host_of_rank[r] == c.host_of_rank[r - 1]) continue;
    size_t last = r;
    while (last + 1 < c.host_of_rank.size() && c.host_of_rank[last + 1] == c.host_of_rank[r]) ++last;
    hosts += std::string(hosts.empty() ? "" : "; ") + c.host_of_rank[r] + ": rank" + (last > r ? "s " : " ") +
             std::to_string(r) + (last > r ? "-" + std::to_string(last) : "");
  }
  std::string out = "trainer calibrate, " + c.when + ": " + std::to_string(c.host_of_rank.size()) + " rank" +
                    (c.host_of_rank.size() == 1 ? "" : "s") + " (" + hosts + ")\n";
  out += "configuration " + c.config + "; device " + c.device + " (" + c.storage + ")\n";
  for (const std::string& n : c.notes) out += n + "\n";
  if (!c.links.empty())
    out += "links: " + c.sizes + "; the line fitted on the sizes marked fitted, the planner's time on the numbers "
           "below (planner/link_fit.h), errors (predicted - measured) / measured\n";
  return out;
}

}  // namespace

CalibrationReport make_calibration_report(const Calibration& c) {
  CalibrationReport r;
  const PlannerLinks f = c.links.empty() ? PlannerLinks{} : fit_planner_links(c.links);
  fill_numbers(c, f, r);
  std::string comment = header(c) + link_table(c, r) + matmul_table(c);
  if (!c.links.empty()) comment += "the planner's largest error on a held-out size: " + pct(r.worst_held_out).substr(1) + "\n";
  r.yaml = format_hardware_section(r.numbers, r.keys, comment);
  return r;
}

}  // namespace trainer
