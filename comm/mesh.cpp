// Mesh arithmetic. Every group is described by which coordinates its members
// share (the color) and which vary (the key); group_ranks and all_groups are
// derived from group_split so the three can never disagree.
#include "comm/mesh.h"

#include <stdexcept>

namespace trainer {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

[[noreturn]] void fail(const std::string& msg) { throw ConfigError(msg); }

}  // namespace

MeshShape resolve_mesh(const ParallelConfig& p, int world_size, int local_world_size) {
  if (world_size < 1) fail("parallel: world size " + str(world_size) + " must be >= 1");
  auto positive = [](const char* key, int v) {
    if (v < 1) fail(std::string("parallel.") + key + "=" + str(v) + " must be >= 1");
  };
  positive("tp", p.tp);
  positive("pp", p.pp);
  positive("cp", p.cp);
  positive("ep", p.ep);
  if (p.dp < 0) fail("parallel.dp=" + str(p.dp) + " must be >= 1, or 0 for automatic");

  const int64_t model_parallel = int64_t(p.tp) * p.pp * p.cp;
  const std::string product =
      "tp=" + str(p.tp) + " x pp=" + str(p.pp) + " x cp=" + str(p.cp) + " = " + str(model_parallel);
  MeshShape s;
  s.tp = p.tp;
  s.pp = p.pp;
  s.cp = p.cp;
  s.ep = p.ep;
  if (p.dp == 0) {
    if (world_size % model_parallel != 0)
      fail("parallel: " + product + " does not divide the " + str(world_size) + " processes");
    s.dp = int(world_size / model_parallel);
  } else {
    const int64_t total = model_parallel * p.dp;
    if (total != world_size)
      fail("parallel: tp=" + str(p.tp) + " x pp=" + str(p.pp) + " x cp=" + str(p.cp) + " x dp=" + str(p.dp) + " = " +
           str(total) + ", but this run has " + str(world_size) +
           " processes (they must be equal; parallel.dp=0 picks dp automatically)");
    s.dp = p.dp;
  }

  // A TP group is tp consecutive ranks and launchers fill nodes with
  // consecutive ranks, so the group stays on one node exactly when tp divides
  // the node's process count.
  if (local_world_size > 0) {
    if (local_world_size > world_size)
      fail("parallel: " + str(local_world_size) + " processes per node exceed the " + str(world_size) +
           " processes of the run");
    const bool whole_nodes = p.tp_across_nodes && s.tp > local_world_size && s.tp % local_world_size == 0;
    if (s.tp > local_world_size && !whole_nodes)
      fail("parallel.tp=" + str(s.tp) + " exceeds the " + str(local_world_size) +
           " GPUs per node (tensor parallelism must stay inside a node" +
           (p.tp_across_nodes ? "; parallel.tp_across_nodes needs tp a multiple of the GPUs per node)"
                              : "; parallel.tp_across_nodes=true runs it across whole nodes, slowly)"));
    if (!whole_nodes && local_world_size % s.tp != 0)
      fail("parallel.tp=" + str(s.tp) + " does not divide the " + str(local_world_size) +
           " GPUs per node (a tensor-parallel group would span two nodes; tensor parallelism must stay inside a "
           "node)");
  }

  const int dp_cp = s.dp * s.cp;
  if (dp_cp % s.ep != 0)
    fail("parallel.ep=" + str(s.ep) + " must divide dp x cp = " + str(dp_cp) + " (dp=" + str(s.dp) +
         ", cp=" + str(s.cp) + "; experts are spread over those ranks)");
  return s;
}

std::string describe(const MeshShape& s) {
  return "mesh: " + str(s.world()) + " ranks = pp " + str(s.pp) + " x dp " + str(s.dp) + " x cp " + str(s.cp) +
         " x tp " + str(s.tp) + ", ep " + str(s.ep) + " x edp " + str(s.edp());
}

Coords coords_of(const MeshShape& s, int rank) {
  if (rank < 0 || rank >= s.world())
    throw std::out_of_range("rank " + str(rank) + " is outside the mesh of " + str(s.world()) + " ranks");
  Coords c;
  c.tp = rank % s.tp;
  rank /= s.tp;
  c.cp = rank % s.cp;
  rank /= s.cp;
  c.dp = rank % s.dp;
  c.pp = rank / s.dp;
  return c;
}

int rank_of(const MeshShape& s, const Coords& c) {
  if (c.tp < 0 || c.tp >= s.tp || c.cp < 0 || c.cp >= s.cp || c.dp < 0 || c.dp >= s.dp || c.pp < 0 ||
      c.pp >= s.pp)
    throw std::out_of_range("coordinates (tp " + str(c.tp) + ", cp " + str(c.cp) + ", dp " + str(c.dp) + ", pp " +
                            str(c.pp) + ") are outside the mesh tp " + str(s.tp) + " x cp " + str(s.cp) +
                            " x dp " + str(s.dp) + " x pp " + str(s.pp));
  return ((c.pp * s.dp + c.dp) * s.cp + c.cp) * s.tp + c.tp;
}

const char* axis_name(Axis a) {
  switch (a) {
    case Axis::TP: return "tp";
    case Axis::CP: return "cp";
    case Axis::DP: return "dp";
    case Axis::PP: return "pp";
    case Axis::DP_CP: return "dp_cp";
    case Axis::EP: return "ep";
    case Axis::EDP: return "edp";
  }
  return "?";
}

int axis_size(const MeshShape& s, Axis a) {
  switch (a) {
    case Axis::TP: return s.tp;
    case Axis::CP: return s.cp;
    case Axis::DP: return s.dp;
    case Axis::PP: return s.pp;
    case Axis::DP_CP: return s.dp * s.cp;
    case Axis::EP: return s.ep;
    case Axis::EDP: return s.edp();
  }
  return 0;
}

int num_groups(const MeshShape& s, Axis a) { return s.world() / axis_size(s, a); }

GroupSplit group_split(const MeshShape& s, int rank, Axis a) {
  const Coords c = coords_of(s, rank);
  const int m = c.dp * s.cp + c.cp;  // position in the (pp, tp) slice's DP_CP group
  const int slice = c.pp * s.tp + c.tp;
  switch (a) {
    case Axis::TP: return {rank / s.tp, c.tp};
    case Axis::CP: return {(c.pp * s.dp + c.dp) * s.tp + c.tp, c.cp};
    case Axis::DP: return {(c.pp * s.cp + c.cp) * s.tp + c.tp, c.dp};
    case Axis::PP: return {rank % (s.dp * s.cp * s.tp), c.pp};
    case Axis::DP_CP: return {slice, m};
    case Axis::EP: return {slice * s.edp() + m / s.ep, m % s.ep};
    case Axis::EDP: return {slice * s.ep + m % s.ep, m / s.ep};
  }
  return {};
}

std::vector<std::vector<int>> all_groups(const MeshShape& s, Axis a) {
  std::vector<std::vector<int>> groups(size_t(num_groups(s, a)), std::vector<int>(size_t(axis_size(s, a)), -1));
  for (int r = 0; r < s.world(); ++r) {
    const GroupSplit g = group_split(s, r, a);
    groups[size_t(g.color)][size_t(g.key)] = r;
  }
  return groups;
}

std::vector<int> group_ranks(const MeshShape& s, int rank, Axis a) {
  const GroupSplit mine = group_split(s, rank, a);
  std::vector<int> out(size_t(axis_size(s, a)), -1);
  for (int r = 0; r < s.world(); ++r) {
    const GroupSplit g = group_split(s, r, a);
    if (g.color == mine.color) out[size_t(g.key)] = r;
  }
  return out;
}

std::string group_name(const MeshShape& s, Axis a, const Coords& c) {
  // Outermost first, as the rank formula nests them.
  std::string fixed;
  auto add = [&](const char* name, int size, int value) {
    if (size <= 1) return;
    if (!fixed.empty()) fixed += ',';
    fixed += name;
    fixed += str(value);
  };
  const bool dp_cp_varies = a == Axis::DP_CP || a == Axis::EP || a == Axis::EDP;
  add("pp", a == Axis::PP ? 1 : s.pp, c.pp);
  add("dp", a == Axis::DP || dp_cp_varies ? 1 : s.dp, c.dp);
  add("cp", a == Axis::CP || dp_cp_varies ? 1 : s.cp, c.cp);
  add("tp", a == Axis::TP ? 1 : s.tp, c.tp);
  const int m = c.dp * s.cp + c.cp;
  if (a == Axis::EP) add("edp", s.edp(), m / s.ep);
  if (a == Axis::EDP) add("ep", s.ep, m % s.ep);
  const std::string name = axis_name(a);
  return fixed.empty() ? name : name + "[" + fixed + "]";
}

std::string group_name(const MeshShape& s, Axis a, int rank) { return group_name(s, a, coords_of(s, rank)); }

}  // namespace trainer
