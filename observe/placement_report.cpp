#include "observe/placement_report.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <set>

namespace trainer {

namespace {

constexpr int kHostBytes = 64;

// "0-3" or "0,2,5"
std::string rank_list(const std::vector<int>& r) {
  bool run = r.size() > 1;
  for (size_t i = 1; i < r.size(); ++i) run = run && r[i] == r[i - 1] + 1;
  if (run) return std::to_string(r.front()) + "-" + std::to_string(r.back());
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? "," : "") + std::to_string(r[i]);
  return s;
}

}  // namespace

int count_nodes(const std::vector<std::string>& host_of_rank) {
  std::vector<std::string> h = host_of_rank;
  std::sort(h.begin(), h.end());
  return int(std::unique(h.begin(), h.end()) - h.begin());
}

RankPlaces gather_rank_places(Communicator& host, int local_rank) {
  const int n = host.size();
  constexpr int kInts = kHostBytes / 4 + 1;  // the name as int32 (no byte dtype), then the local rank
  std::vector<int32_t> mine(kInts, 0), all(size_t(n) * kInts, 0);
  char name[kHostBytes] = {};
  gethostname(name, kHostBytes - 1);
  std::memcpy(mine.data(), name, kHostBytes);
  mine[kInts - 1] = local_rank;
  if (n > 1)
    host.all_gather(Tensor(all.data(), DType::I32, {int64_t(all.size())}), Tensor(mine.data(), DType::I32, {kInts}));
  else
    all = mine;
  RankPlaces out;
  for (int r = 0; r < n; ++r) {
    const int32_t* at = all.data() + size_t(r) * kInts;
    const char* p = reinterpret_cast<const char*>(at);
    out.host.emplace_back(p, strnlen(p, kHostBytes));
    out.local_rank.push_back(at[kInts - 1]);
  }
  return out;
}

std::string format_placement(const MeshShape& mesh, const std::vector<std::string>& host_of_rank) {
  std::map<std::string, std::vector<int>> by_node;  // first rank's order below
  std::vector<std::string> order;
  for (int r = 0; r < int(host_of_rank.size()); ++r) {
    auto& v = by_node[host_of_rank[size_t(r)]];
    if (v.empty()) order.push_back(host_of_rank[size_t(r)]);
    v.push_back(r);
  }
  std::string s = "placement: " + std::to_string(order.size()) + (order.size() == 1 ? " node (" : " nodes (");
  for (size_t i = 0; i < order.size(); ++i)
    s += (i ? ", " : "") + order[i] + ": ranks " + rank_list(by_node[order[i]]);
  s += ")";
  std::string warnings;
  struct AxisUse {
    Axis axis;
    const char* why;
  };
  const AxisUse fast[] = {{Axis::TP, "tensor-parallel"}, {Axis::CP, "context-parallel"}, {Axis::EP, "expert-parallel"}};
  for (const AxisUse& a : fast) {
    if (axis_size(mesh, a.axis) < 2) continue;
    int crossing = 0;
    std::vector<int> first;
    const auto groups = all_groups(mesh, a.axis);
    for (const auto& g : groups) {
      std::set<std::string> nodes;
      for (int r : g) nodes.insert(host_of_rank.at(size_t(r)));
      if (nodes.size() > 1 && crossing++ == 0) first = g;
    }
    const std::string name = axis_name(a.axis);
    if (crossing == 0) {
      s += "; " + name + " groups inside nodes";
      continue;
    }
    std::string hosts;
    std::set<std::string> seen;
    for (int r : first)
      if (seen.insert(host_of_rank[size_t(r)]).second) hosts += (hosts.empty() ? "" : ", ") + host_of_rank[size_t(r)];
    warnings += "warning: " + std::to_string(crossing) + " of " + std::to_string(groups.size()) + " " + name +
                " groups span nodes (ranks " + rank_list(first) + " on " + hosts + "): " + a.why +
                " traffic crosses the network; make parallel." + name + " divide the ranks per node\n";
  }
  for (Axis a : {Axis::DP_CP, Axis::PP}) {
    if (axis_size(mesh, a) < 2) continue;
    bool crosses = false;
    for (const auto& g : all_groups(mesh, a)) {
      std::set<std::string> nodes;
      for (int r : g) nodes.insert(host_of_rank.at(size_t(r)));
      crosses = crosses || nodes.size() > 1;
    }
    s += std::string("; ") + axis_name(a) + (crosses ? " crosses nodes" : " inside nodes");
  }
  return s + "\n" + warnings;
}

}  // namespace trainer
