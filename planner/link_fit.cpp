#include "planner/link_fit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "planner/collective_cost.h"

namespace trainer {

namespace {

// Least squares of rows . x = rhs (each row already divided by its measured
// time, so rhs is all ones and residuals are relative), with x[j] >= 0 for
// every j flagged in `nonneg`. Columns are scaled to a largest entry of 1
// first: bytes (1e7) and latency indicators (1) share one matrix. A column
// that is all zero, or that the active set fixes at 0, gets 0.
std::vector<double> solve_nonneg(const std::vector<std::vector<double>>& rows, const std::vector<bool>& nonneg) {
  const size_t m = nonneg.size();
  std::vector<double> scale(m, 0);
  for (const auto& r : rows)
    for (size_t j = 0; j < m; ++j) scale[j] = std::max(scale[j], std::fabs(r[j]));
  std::vector<bool> active(m);
  for (size_t j = 0; j < m; ++j) active[j] = scale[j] > 0;
  for (;;) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < m; ++j)
      if (active[j]) cols.push_back(j);
    const size_t k = cols.size();
    // Normal equations [A^T A | A^T 1] on the active, scaled columns.
    std::vector<std::vector<double>> a(k, std::vector<double>(k + 1, 0));
    for (const auto& r : rows)
      for (size_t i = 0; i < k; ++i) {
        const double ri = r[cols[i]] / scale[cols[i]];
        for (size_t j = 0; j < k; ++j) a[i][j] += ri * r[cols[j]] / scale[cols[j]];
        a[i][k] += ri;
      }
    std::vector<double> y(k, 0);
    for (size_t c = 0; c < k; ++c) {  // Gauss-Jordan with partial pivoting
      size_t p = c;
      for (size_t i = c + 1; i < k; ++i)
        if (std::fabs(a[i][c]) > std::fabs(a[p][c])) p = i;
      std::swap(a[c], a[p]);
      if (std::fabs(a[c][c]) < 1e-12) throw std::invalid_argument("the measured times do not tell the unknowns apart");
      for (size_t i = 0; i < k; ++i) {
        if (i == c) continue;
        const double f = a[i][c] / a[c][c];
        for (size_t j = c; j <= k; ++j) a[i][j] -= f * a[c][j];
      }
    }
    for (size_t c = 0; c < k; ++c) y[c] = a[c][k] / a[c][c];
    // The most negative constrained unknown is held at zero, and the rest refitted.
    size_t worst = m;
    for (size_t c = 0; c < k; ++c)
      if (nonneg[cols[c]] && y[c] < 0 && (worst == m || y[c] < y[worst])) worst = c;
    if (worst == m) {
      std::vector<double> x(m, 0);
      for (size_t c = 0; c < k; ++c) x[cols[c]] = y[c] / scale[cols[c]];
      return x;
    }
    active[cols[worst]] = false;
  }
}

template <typename T>
std::vector<T> every_other(const std::vector<T>& v, size_t first) {
  std::vector<T> out;
  for (size_t i = first; i < v.size(); i += 2) out.push_back(v[i]);
  return out;
}

// The unknowns of the planner's fit, in order.
enum Unknown { kCollective, kInsideStep, kAcrossStep, kInsideTime, kAcrossTime, kUnknowns };

}  // namespace

std::vector<double> fitting_half(const std::vector<double>& v) { return every_other(v, 0); }
std::vector<double> held_out_half(const std::vector<double>& v) { return every_other(v, 1); }

LineFit fit_line(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  if (bytes.size() != seconds.size() || bytes.size() < 2)
    throw std::invalid_argument("fit_line: needs at least two sizes with one time each");
  std::vector<std::vector<double>> rows;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!(seconds[i] > 0)) throw std::invalid_argument("fit_line: a measured time is not positive");
    rows.push_back({1 / seconds[i], bytes[i] / seconds[i]});
  }
  const std::vector<double> x = solve_nonneg(rows, {true, false});
  if (!(x[1] > 0)) throw std::invalid_argument("fit_line: the times do not grow with the size (no bandwidth to fit)");
  return LineFit{x[0], 1 / x[1]};
}

PlannerLinks fit_planner_links(const std::vector<CollectiveTimes>& measured) {
  std::vector<std::vector<double>> rows;
  PlannerLinks out;
  for (const CollectiveTimes& c : measured) {
    (c.across_nodes ? out.across : out.inside) = true;
    const std::vector<double> n = fitting_half(c.bytes), t = fitting_half(c.seconds);
    for (size_t i = 0; i < n.size(); ++i) {
      if (!(t[i] > 0)) throw std::invalid_argument("fit_planner_links: a measured time is not positive");
      std::vector<double> r(kUnknowns, 0);
      const bool send = c.kind == CommKind::Send;
      r[kCollective] = send ? 0 : 1;
      r[c.across_nodes ? kAcrossStep : kInsideStep] = ring_steps(c.kind, c.ranks);
      // Seconds per byte of the link as the planner divides: the wire bytes
      // over a bandwidth that grows with the group's members per node.
      r[c.across_nodes ? kAcrossTime : kInsideTime] =
          wire_share(c.kind, c.ranks) * n[i] / double(c.across_nodes ? c.members_per_node : 1);
      for (double& v : r) v /= t[i];
      rows.push_back(r);
    }
  }
  const std::vector<double> x = solve_nonneg(rows, {true, true, true, false, false});
  if ((out.inside && !(x[kInsideTime] > 0)) || (out.across && !(x[kAcrossTime] > 0)))
    throw std::invalid_argument("fit_planner_links: the times do not grow with the size (no bandwidth to fit)");
  out.collective_latency = x[kCollective];
  if (out.inside) {
    out.inside_bandwidth = 1 / x[kInsideTime];
    out.inside_step_latency = x[kInsideStep];
  }
  if (out.across) {
    out.across_bandwidth = 1 / x[kAcrossTime];
    out.across_step_latency = x[kAcrossStep];
  }
  return out;
}

Hardware with_links(const Hardware& base, const PlannerLinks& f) {
  Hardware h = base;
  if (f.inside || f.across) h.collective_latency_us = 1e6 * f.collective_latency;
  if (f.inside) {
    h.nvlink_gb_s = 2 * f.inside_bandwidth / 1e9;  // a data sheet's both directions
    h.nvlink_latency_us = 1e6 * f.inside_step_latency;
  }
  if (f.across) {
    h.network_gbit_s = 8 * f.across_bandwidth / 1e9;
    h.network_latency_us = 1e6 * f.across_step_latency;
  }
  return h;
}

}  // namespace trainer
