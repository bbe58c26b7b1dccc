// Measured collective times turned into the hardware numbers of the time
// model (`trainer calibrate`, docs/PLANNING.md "Calibrating before planning
// a real cluster").
//
// Each collective's times over a range of sizes are fitted as t(n) = a + n/B
// on every other size (the even-numbered ones, smallest first) and checked
// on the sizes left out. Then one fit over every collective of every link
// finds the numbers the planner prices with (planner/collective_cost.h):
//
//   t = collective_latency [not for a send] + ring_steps x step_latency(link)
//       + wire_share x n / bandwidth(link)
//
// with the unknowns collective_latency, a step latency and a bandwidth per
// link (inside a node, across nodes). Both fits weigh each point by 1/t, so
// that a 4 KiB call counts as much as a 64 MiB one (relative errors); a
// latency the data pushes below zero is held at zero and the rest refitted.
#pragma once

#include <string>
#include <vector>

#include "comm/timed_communicator.h"
#include "planner/hardware.h"

namespace trainer {

// One collective on one link: payload bytes (as the planner counts them)
// and the median seconds of a call, by size, smallest first.
struct CollectiveTimes {
  CommKind kind = CommKind::AllReduce;
  bool across_nodes = false;
  int ranks = 2;          // of the group measured
  int members_per_node = 1;
  std::vector<double> bytes, seconds;
};

// t(n) = a + n / B (a in seconds, B in bytes/s of payload).
struct LineFit {
  double a = 0, B = 0;
  double at(double n) const { return a + n / B; }
};

// Least squares on relative residuals, a >= 0. Throws std::invalid_argument
// for fewer than two points or times that do not grow with the size.
LineFit fit_line(const std::vector<double>& bytes, const std::vector<double>& seconds);

// The fitting half (indices 0, 2, 4, ...) and the held-out half (1, 3, ...).
std::vector<double> fitting_half(const std::vector<double>& v);
std::vector<double> held_out_half(const std::vector<double>& v);

// (predicted - measured) / measured.
inline double relative_error(double predicted, double measured) { return (predicted - measured) / measured; }

// The planner's link numbers fitted to every collective given (on the
// fitting half of each). Fields of a link with no collective are 0.
struct PlannerLinks {
  bool inside = false, across = false;
  double inside_bandwidth = 0, across_bandwidth = 0;  // bytes/s per rank, per direction
  double collective_latency = 0;                       // seconds per call
  double inside_step_latency = 0, across_step_latency = 0;  // seconds per message
};
PlannerLinks fit_planner_links(const std::vector<CollectiveTimes>& measured);

// `base` with the fitted links in the planner's units (nvlink_gb_s as a
// data sheet's both-directions figure, network_gbit_s per GPU, latencies
// in microseconds); links not fitted keep base's numbers.
Hardware with_links(const Hardware& base, const PlannerLinks& links);

}  // namespace trainer
