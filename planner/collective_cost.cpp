#include "planner/collective_cost.h"

namespace trainer {

double ring_steps(CommKind kind, int p) {
  if (kind == CommKind::Send) return 1;
  if (kind == CommKind::Recv || p <= 1) return 0;
  return kind == CommKind::AllReduce ? 2.0 * (p - 1) : double(p - 1);
}

double wire_share(CommKind kind, int p) {
  if (kind == CommKind::Send) return 1;
  if (kind == CommKind::Recv || p <= 1) return 0;
  const double ring = double(p - 1) / double(p);
  return kind == CommKind::AllReduce ? 2 * ring : ring;
}

double call_latency(CommKind kind, int p, double step_latency_s, const Hardware& hw) {
  const double steps = ring_steps(kind, p) * step_latency_s;
  if (kind == CommKind::Send || kind == CommKind::Recv) return steps;
  return 1e-6 * hw.collective_latency_us + steps;
}

double link_bandwidth(const Hardware& hw, bool across_nodes, int members_per_node) {
  return across_nodes ? hw.network_gbit_s * 1e9 / 8 * double(members_per_node) : hw.nvlink_gb_s * 1e9 / 2;
}

double step_latency(const Hardware& hw, bool across_nodes) {
  return 1e-6 * (across_nodes ? hw.network_latency_us : hw.nvlink_latency_us);
}

double collective_seconds(CommKind kind, int p, double payload, bool across_nodes, int members_per_node,
                          const Hardware& hw) {
  return wire_share(kind, p) * payload / link_bandwidth(hw, across_nodes, members_per_node) +
         call_latency(kind, p, step_latency(hw, across_nodes), hw);
}

}  // namespace trainer
