#include "calibrate/link_groups.h"

#include <algorithm>

namespace trainer {

int ranks_on_first_node(const std::vector<std::string>& host_of_rank) {
  if (host_of_rank.empty()) return 1;
  return int(std::count(host_of_rank.begin(), host_of_rank.end(), host_of_rank.front()));
}

namespace {

// Hosts in order of their first rank, and each host's ranks ascending.
std::vector<std::vector<int>> ranks_by_host(const std::vector<std::string>& host_of_rank) {
  std::vector<std::string> hosts;
  std::vector<std::vector<int>> out;
  for (int r = 0; r < int(host_of_rank.size()); ++r) {
    const auto at = std::find(hosts.begin(), hosts.end(), host_of_rank[size_t(r)]);
    if (at == hosts.end()) {
      hosts.push_back(host_of_rank[size_t(r)]);
      out.push_back({r});
    } else {
      out[size_t(at - hosts.begin())].push_back(r);
    }
  }
  return out;
}

}  // namespace

std::vector<LinkGroup> link_groups(const std::vector<std::string>& host_of_rank, std::vector<std::string>* notes) {
  std::vector<LinkGroup> out;
  const int world = int(host_of_rank.size());
  if (world <= 1) {
    notes->push_back("a world of 1 rank: no link between ranks to measure (launch calibrate as the run is "
                     "launched, with torchrun, mpirun or srun, to measure its links); compute numbers only");
    return out;
  }
  const std::vector<std::vector<int>> nodes = ranks_by_host(host_of_rank);
  LinkGroup inside;
  inside.label = "inside node " + host_of_rank.front();
  inside.members = nodes.front();
  // Every node with as many ranks as node 0 runs its own group meanwhile:
  // a run's nodes all work at once (on shared cores that is what they get).
  for (const std::vector<int>& n : nodes)
    if (n.size() == inside.members.size()) inside.concurrent.push_back(n);
  LinkGroup across;
  across.label = "across nodes";
  across.across_nodes = true;
  // Ring i: the i-th rank of every node, for every i that all nodes have.
  size_t rings = nodes.front().size();
  for (const std::vector<int>& n : nodes) rings = std::min(rings, n.size());
  for (size_t i = 0; i < rings; ++i) {
    std::vector<int> ring;
    for (const std::vector<int>& n : nodes) ring.push_back(n[i]);
    across.concurrent.push_back(ring);
  }
  across.members = across.concurrent.front();
  if (inside.members.size() >= 2)
    out.push_back(inside);
  else
    notes->push_back("one rank on node " + host_of_rank.front() + ": no link inside a node measured (nvlink_gb_s, "
                     "nvlink_latency_us left out)");
  if (across.members.size() >= 2)
    out.push_back(across);
  else
    notes->push_back("one node: no link across nodes measured (network_gbit_s, network_latency_us left out)");
  return out;
}

}  // namespace trainer
