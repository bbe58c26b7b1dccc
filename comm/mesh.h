// The process mesh: which rank holds which slice of the model and the data.
// Pure arithmetic, no communication; communicators are built from it by split
// (color = group index, key = position in the group).
//
// world = pp x dp x cp x tp with tp varying fastest, then cp, dp, pp
// (Megatron's order): a tensor-parallel group is tp consecutive ranks, which
// launchers place on one node, where its many small collectives are cheapest.
//
//   rank = ((pp * DP + dp) * CP + cp) * TP + tp
//
// Expert parallelism does not add ranks: it folds into the dp x cp ranks of
// one (pp, tp) slice. Ordered by m = dp * CP + cp, those ranks fall into
// blocks of ep consecutive members: one block is an expert-parallel (EP) group,
// which splits the experts between its members; the members at the same
// position of every block form an expert-data-parallel (EDP) group, which
// holds the same experts and reduces their gradients.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace trainer {

struct MeshShape {
  int tp = 1, cp = 1, dp = 1, pp = 1, ep = 1;
  int world() const { return tp * cp * dp * pp; }
  int edp() const { return dp * cp / ep; }  // expert-data-parallel group size
  bool operator==(const MeshShape&) const = default;
};

// dp = 0 in the config means world / (tp * pp * cp). Throws ConfigError saying
// which numbers conflict: the product and the process count, tp against the
// processes of one node (tensor parallelism must stay inside a node), ep
// against dp x cp. local_world_size <= 0: the node size is unknown and not
// checked.
MeshShape resolve_mesh(const ParallelConfig& p, int world_size, int local_world_size);

// "mesh: 16 ranks = pp 2 x dp 2 x cp 2 x tp 2, ep 2 x edp 2"
std::string describe(const MeshShape& s);

struct Coords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  bool operator==(const Coords&) const = default;
};

// Both throw std::out_of_range for a rank or coordinate outside the mesh.
Coords coords_of(const MeshShape& s, int rank);
int rank_of(const MeshShape& s, const Coords& c);

enum class Axis {
  TP,     // tensor parallel: tp consecutive ranks
  CP,     // context parallel
  DP,     // data parallel
  PP,     // pipeline stages
  DP_CP,  // dp x cp together: gradient reduction and ZeRO sharding with CP
  EP,     // expert parallel: a block of ep members of DP_CP
  EDP,    // expert data parallel: same position in every EP block
};
inline constexpr Axis kAllAxes[] = {Axis::TP, Axis::CP, Axis::DP, Axis::PP, Axis::DP_CP, Axis::EP, Axis::EDP};

const char* axis_name(Axis a);  // "tp", "cp", "dp", "pp", "dp_cp", "ep", "edp"
int axis_size(const MeshShape& s, Axis a);
int num_groups(const MeshShape& s, Axis a);  // world / axis_size

// The communicator split of one rank: ranks with the same color form a
// group; key orders them (equal to the position in group_ranks).
struct GroupSplit {
  int color = 0;  // 0 .. num_groups - 1
  int key = 0;    // 0 .. axis_size - 1
};
GroupSplit group_split(const MeshShape& s, int rank, Axis a);

// The ranks of `rank`'s group along the axis, ascending, which is also their
// order in the group (key).
std::vector<int> group_ranks(const MeshShape& s, int rank, Axis a);
// Every group of the axis, indexed by color.
std::vector<std::vector<int>> all_groups(const MeshShape& s, Axis a);

// A group for messages, naming the coordinates its members share and leaving
// out axes of size 1: "dp[pp0,tp1]", "tp[pp1,dp0,cp1]", "ep[pp0,tp0,edp1]"
// (the EP block index), "edp[pp0,tp0,ep1]" (the position in the block).
std::string group_name(const MeshShape& s, Axis a, const Coords& c);
std::string group_name(const MeshShape& s, Axis a, int rank);

}  // namespace trainer
