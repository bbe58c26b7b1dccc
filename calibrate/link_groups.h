// Which links `trainer calibrate` can measure, from the hosts the ranks
// reported (observe/placement_report.h gather_rank_places): inside a node,
// the ranks of node 0 (the host of rank 0), when it has two or more, timed
// together with every other node of as many ranks; across nodes, one rank
// per node (the first of each host), when there are two nodes or more, timed
// together with the rings of the nodes' second, third, ... ranks, so that
// the bandwidth measured is a rank's share of its node's links while every
// rank sends, which is what the planner's network_gbit_s per GPU means.
// Every rank computes the same answer.
#pragma once

#include <string>
#include <vector>

#include "calibrate/link_timing.h"

namespace trainer {

// The links in measuring order (inside, then across), and in *notes a line
// for each kind of link there is none of, saying why.
std::vector<LinkGroup> link_groups(const std::vector<std::string>& host_of_rank, std::vector<std::string>* notes);

// Ranks on the host of rank 0.
int ranks_on_first_node(const std::vector<std::string>& host_of_rank);

}  // namespace trainer
