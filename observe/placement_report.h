// Where the mesh's groups sit on the nodes: every rank's host name (gathered
// once at start-up), the ranks of each node, and whether the groups whose
// traffic needs fast links (tp, cp, ep) stay inside a node. Ranks are
// numbered node after node and tp is the mesh's fastest axis
// (comm/mesh.h coords_of), so a tp group stays inside a node whenever tp
// divides the ranks per node; this says so, or names the groups that cross.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/mesh.h"

namespace trainer {

// Where each rank runs, by rank: its host name and its local rank there.
struct RankPlaces {
  std::vector<std::string> host;
  std::vector<int> local_rank;
};

// How many distinct hosts.
int count_nodes(const std::vector<std::string>& host_of_rank);

// Collective over `host` (every rank), once at start-up: the placement line
// and the rank monitor (observe/rank_monitor.h) both read it.
RankPlaces gather_rank_places(Communicator& host, int local_rank);

// "placement: 2 nodes (trn-node0: ranks 0-1, trn-node1: ranks 2-3); tp groups
// inside nodes; dp crosses nodes\n", plus a "warning: ..." line per axis of
// tp, cp, ep whose groups span nodes, naming the first such group.
std::string format_placement(const MeshShape& mesh, const std::vector<std::string>& host_of_rank);

}  // namespace trainer
