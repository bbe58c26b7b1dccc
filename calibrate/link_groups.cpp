#include "calibrate/link_groups.h"

#include <algorithm>

namespace trainer {

int ranks_on_first_node(const std::vector<std::string>& host_of_rank) {
  if (host_of_rank.empty()) return 1;
  return int(std::count(host_of_rank.begin(), host_of_rank.end(), host_of_rank.front()));
}

std::vector<LinkGroup> link_groups(const std::vector<std::string>& host_of_rank, std::vector<std::string>* notes) {
  std::vector<LinkGroup> out;
  const int world = int(host_of_rank.size());
  if (world <= 1) {
    notes->push_back("a world of 1 rank: no link between ranks to measure (launch calibrate as the run is "
                     "launched, with torchrun, mpirun or srun, to measure its links); compute numbers only");
    return out;
  }
  LinkGroup inside;
  inside.label = "inside node " + host_of_rank.front();
  for (int r = 0; r < world; ++r)
    if (host_of_rank[size_t(r)] == host_of_rank.front()) inside.members.push_back(r);
  LinkGroup across;
  across.label = "across nodes";
  across.across_nodes = true;
  std::vector<std::string> seen;
  for (int r = 0; r < world; ++r) {
    const std::string& h = host_of_rank[size_t(r)];
    if (std::find(seen.begin(), seen.end(), h) != seen.end()) continue;
    seen.push_back(h);
    across.members.push_back(r);
  }
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
