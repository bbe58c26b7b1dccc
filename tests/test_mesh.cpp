// The rank <-> coordinates mapping and the groups built from it, checked
// exhaustively for every shape up to 16 ranks: a wrong group here is a silent
// wrong reduction later, so each axis must partition the world exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "comm/mesh.h"
#include "observe/link_report.h"
#include "observe/placement_report.h"

using namespace trainer;

namespace {

std::string error_of(const ParallelConfig& p, int world, int local) {
  try {
    resolve_mesh(p, world, local);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a ConfigError> ") + e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every valid shape with at most 16 ranks (and every ep that divides dp x cp).
std::vector<MeshShape> small_shapes() {
  std::vector<MeshShape> out;
  for (int tp = 1; tp <= 16; ++tp)
    for (int cp = 1; tp * cp <= 16; ++cp)
      for (int dp = 1; tp * cp * dp <= 16; ++dp)
        for (int pp = 1; tp * cp * dp * pp <= 16; ++pp)
          for (int ep = 1; ep <= dp * cp; ++ep)
            if ((dp * cp) % ep == 0) out.push_back({tp, cp, dp, pp, ep});
  return out;
}

// The coordinates the members of a group share; members of different groups
// differ in at least one of them.
std::vector<int> shared(const MeshShape& s, int rank, Axis a) {
  const Coords c = coords_of(s, rank);
  const int m = c.dp * s.cp + c.cp;
  switch (a) {
    case Axis::TP: return {c.pp, c.dp, c.cp};
    case Axis::CP: return {c.pp, c.dp, c.tp};
    case Axis::DP: return {c.pp, c.cp, c.tp};
    case Axis::PP: return {c.dp, c.cp, c.tp};
    case Axis::DP_CP: return {c.pp, c.tp};
    case Axis::EP: return {c.pp, c.tp, m / s.ep};
    case Axis::EDP: return {c.pp, c.tp, m % s.ep};
  }
  return {};
}

}  // namespace

TEST_CASE("mesh: coordinates and ranks round trip in Megatron order", "[mesh]") {
  const auto shapes = small_shapes();
  REQUIRE(shapes.size() > 100);
  for (const MeshShape& s : shapes) {
    INFO(describe(s));
    for (int r = 0; r < s.world(); ++r) {
      const Coords c = coords_of(s, r);
      REQUIRE(c.tp >= 0);
      REQUIRE(c.tp < s.tp);
      REQUIRE(c.cp < s.cp);
      REQUIRE(c.dp < s.dp);
      REQUIRE(c.pp < s.pp);
      REQUIRE(rank_of(s, c) == r);
      REQUIRE(r == ((c.pp * s.dp + c.dp) * s.cp + c.cp) * s.tp + c.tp);
    }
    CHECK_THROWS_AS(coords_of(s, -1), std::out_of_range);
    CHECK_THROWS_AS(coords_of(s, s.world()), std::out_of_range);
    CHECK_THROWS_AS(rank_of(s, Coords{s.tp, 0, 0, 0}), std::out_of_range);
    CHECK_THROWS_AS(rank_of(s, Coords{0, 0, 0, s.pp}), std::out_of_range);
  }
  // tp varies fastest, then cp, dp, pp.
  const MeshShape s{2, 2, 2, 2, 1};
  CHECK(coords_of(s, 1) == Coords{1, 0, 0, 0});
  CHECK(coords_of(s, 2) == Coords{0, 1, 0, 0});
  CHECK(coords_of(s, 4) == Coords{0, 0, 1, 0});
  CHECK(coords_of(s, 8) == Coords{0, 0, 0, 1});
  CHECK(coords_of(s, 13) == Coords{1, 0, 1, 1});
}

TEST_CASE("mesh: every axis partitions the world into equal groups", "[mesh]") {
  for (const MeshShape& s : small_shapes()) {
    for (Axis a : kAllAxes) {
      INFO(describe(s) << ", axis " << axis_name(a));
      const auto groups = all_groups(s, a);
      const int size = axis_size(s, a);
      REQUIRE(int(groups.size()) == num_groups(s, a));
      REQUIRE(int(groups.size()) * size == s.world());
      std::vector<int> seen(size_t(s.world()), 0);
      for (size_t color = 0; color < groups.size(); ++color) {
        const auto& g = groups[color];
        REQUIRE(int(g.size()) == size);
        REQUIRE(std::is_sorted(g.begin(), g.end()));
        for (size_t key = 0; key < g.size(); ++key) {
          const int r = g[key];
          REQUIRE(r >= 0);
          REQUIRE(r < s.world());
          ++seen[size_t(r)];
          REQUIRE(shared(s, r, a) == shared(s, g[0], a));
          REQUIRE(group_ranks(s, r, a) == g);
          const GroupSplit split = group_split(s, r, a);
          REQUIRE(split.color == int(color));
          REQUIRE(split.key == int(key));
        }
      }
      for (int n : seen) REQUIRE(n == 1);
      // Ranks sharing the fixed coordinates are in one group: so the groups are
      // exactly the classes of `shared`.
      std::set<std::vector<int>> classes;
      for (int r = 0; r < s.world(); ++r) classes.insert(shared(s, r, a));
      REQUIRE(classes.size() == groups.size());
    }
  }
}

TEST_CASE("mesh: group sizes and the TP groups are consecutive ranks", "[mesh]") {
  for (const MeshShape& s : small_shapes()) {
    INFO(describe(s));
    CHECK(axis_size(s, Axis::TP) == s.tp);
    CHECK(axis_size(s, Axis::CP) == s.cp);
    CHECK(axis_size(s, Axis::DP) == s.dp);
    CHECK(axis_size(s, Axis::PP) == s.pp);
    CHECK(axis_size(s, Axis::DP_CP) == s.dp * s.cp);
    CHECK(axis_size(s, Axis::EP) == s.ep);
    CHECK(axis_size(s, Axis::EDP) * s.ep == s.dp * s.cp);
    for (const auto& g : all_groups(s, Axis::TP)) {
      REQUIRE(g[0] % s.tp == 0);
      for (size_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == g[0] + int(i));
    }
    // A CP group is strided by tp, a DP group by cp*tp, a PP group by dp*cp*tp.
    for (int r = 0; r < s.world(); ++r) {
      const auto cp = group_ranks(s, r, Axis::CP);
      const auto dp = group_ranks(s, r, Axis::DP);
      const auto pp = group_ranks(s, r, Axis::PP);
      for (size_t i = 1; i < cp.size(); ++i) REQUIRE(cp[i] - cp[i - 1] == s.tp);
      for (size_t i = 1; i < dp.size(); ++i) REQUIRE(dp[i] - dp[i - 1] == s.cp * s.tp);
      for (size_t i = 1; i < pp.size(); ++i) REQUIRE(pp[i] - pp[i - 1] == s.dp * s.cp * s.tp);
    }
  }
}

TEST_CASE("mesh: EP blocks and EDP columns partition each dp x cp group", "[mesh]") {
  for (const MeshShape& s : small_shapes()) {
    INFO(describe(s));
    for (const auto& dpcp : all_groups(s, Axis::DP_CP)) {
      const int blocks = s.edp();
      for (int b = 0; b < blocks; ++b) {
        const std::vector<int> block(dpcp.begin() + b * s.ep, dpcp.begin() + (b + 1) * s.ep);
        for (int r : block) REQUIRE(group_ranks(s, r, Axis::EP) == block);
      }
      for (int j = 0; j < s.ep; ++j) {
        std::vector<int> column;
        for (int b = 0; b < blocks; ++b) column.push_back(dpcp[size_t(b * s.ep + j)]);
        for (int r : column) REQUIRE(group_ranks(s, r, Axis::EDP) == column);
      }
      // An EP group and an EDP group of the same slice meet in exactly one rank.
      for (int r : dpcp)
        for (int q : dpcp) {
          const auto ep = group_ranks(s, r, Axis::EP);
          const auto edp = group_ranks(s, q, Axis::EDP);
          int common = 0;
          for (int x : ep) common += int(std::count(edp.begin(), edp.end(), x));
          REQUIRE(common == 1);
        }
    }
  }
  // Worked example: dp 4, cp 2, ep 4 -> dp_cp order (dp,cp) = ranks 0..7.
  const MeshShape s{1, 2, 4, 1, 4};
  CHECK(group_ranks(s, 5, Axis::EP) == std::vector<int>{4, 5, 6, 7});
  CHECK(group_ranks(s, 5, Axis::EDP) == std::vector<int>{1, 5});
  CHECK(group_ranks(s, 5, Axis::DP) == std::vector<int>{1, 3, 5, 7});
  CHECK(group_ranks(s, 5, Axis::CP) == std::vector<int>{4, 5});
}

TEST_CASE("mesh: group names for messages", "[mesh]") {
  const MeshShape s{2, 1, 2, 2, 1};  // tp 2, dp 2, pp 2
  const Coords c{1, 0, 0, 0};        // tp 1, dp 0, pp 0
  CHECK(group_name(s, Axis::DP, c) == "dp[pp0,tp1]");
  CHECK(group_name(s, Axis::TP, c) == "tp[pp0,dp0]");
  CHECK(group_name(s, Axis::PP, c) == "pp[dp0,tp1]");
  CHECK(group_name(s, Axis::DP, rank_of(s, c)) == "dp[pp0,tp1]");

  const MeshShape moe{2, 2, 2, 1, 2};  // tp 2, cp 2, dp 2, ep 2 -> edp 2
  const Coords m{0, 1, 1, 0};          // dp_cp index 3: block 1, position 1
  CHECK(group_name(moe, Axis::CP, m) == "cp[dp1,tp0]");
  CHECK(group_name(moe, Axis::DP_CP, m) == "dp_cp[tp0]");
  CHECK(group_name(moe, Axis::EP, m) == "ep[tp0,edp1]");
  CHECK(group_name(moe, Axis::EDP, m) == "edp[tp0,ep1]");
  CHECK(group_name(MeshShape{}, Axis::DP, Coords{}) == "dp");

  // Different groups of an axis always get different names.
  for (const MeshShape& sh : small_shapes())
    for (Axis a : kAllAxes) {
      std::set<std::string> names;
      for (const auto& g : all_groups(sh, a)) names.insert(group_name(sh, a, g[0]));
      REQUIRE(int(names.size()) == num_groups(sh, a));
    }
}

TEST_CASE("mesh: resolve_mesh fills dp and checks the layout", "[mesh]") {
  ParallelConfig p;
  CHECK(resolve_mesh(p, 1, 1) == MeshShape{1, 1, 1, 1, 1});
  CHECK(resolve_mesh(p, 8, 8) == MeshShape{1, 1, 8, 1, 1});
  p.tp = 2;
  p.pp = 2;
  CHECK(resolve_mesh(p, 16, 8) == MeshShape{2, 1, 4, 2, 1});
  p.cp = 2;
  p.ep = 4;
  CHECK(resolve_mesh(p, 16, 4) == MeshShape{2, 2, 2, 2, 4});
  p.dp = 2;
  CHECK(resolve_mesh(p, 16, 4).dp == 2);
  // Unknown node size: the node check is skipped.
  ParallelConfig wide;
  wide.tp = 8;
  CHECK(resolve_mesh(wide, 8, 0).tp == 8);
}

TEST_CASE("mesh: layout errors say which numbers conflict", "[mesh]") {
  struct Case {
    ParallelConfig p;
    int world, local;
    std::string message;
  };
  auto cfg = [](int tp, int pp, int cp, int dp, int ep) {
    ParallelConfig p;
    p.tp = tp;
    p.pp = pp;
    p.cp = cp;
    p.dp = dp;
    p.ep = ep;
    return p;
  };
  const std::vector<Case> cases = {
      {cfg(2, 2, 1, 0, 1), 6, 6, "parallel: tp=2 x pp=2 x cp=1 = 4 does not divide the 6 processes"},
      {cfg(8, 1, 1, 0, 1), 8, 4,
       "parallel.tp=8 exceeds the 4 GPUs per node (tensor parallelism must stay inside a node; "
       "parallel.tp_across_nodes=true runs it across whole nodes, slowly)"},
      {cfg(1, 1, 1, 0, 3), 4, 4, "parallel.ep=3 must divide dp x cp = 4"},
      {cfg(1, 1, 2, 2, 3), 4, 4, "parallel.ep=3 must divide dp x cp = 4 (dp=2, cp=2"},
      {cfg(4, 1, 1, 0, 1), 12, 6, "parallel.tp=4 does not divide the 6 GPUs per node"},
      {cfg(2, 1, 1, 3, 1), 8, 8, "tp=2 x pp=1 x cp=1 x dp=3 = 6, but this run has 8 processes"},
      {cfg(0, 1, 1, 0, 1), 8, 8, "parallel.tp=0 must be >= 1"},
      {cfg(1, 1, 1, -1, 1), 8, 8, "parallel.dp=-1"},
      {cfg(1, 1, 1, 0, 1), 0, 1, "world size 0"},
      {cfg(1, 1, 1, 0, 1), 4, 8, "8 processes per node exceed the 4 processes"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of(c.p, c.world, c.local);
    INFO(msg);
    CHECK(contains(msg, c.message));
  }
}

TEST_CASE("parallel.tp_across_nodes: a tensor-parallel group of whole nodes, when asked for", "[mesh]") {
  ParallelConfig p;
  p.tp = 8;
  p.tp_across_nodes = true;
  const MeshShape whole = resolve_mesh(p, 16, 4);  // two groups of two nodes each
  CHECK(whole.tp == 8);
  CHECK(whole.dp == 2);
  p.tp = 2;
  CHECK(resolve_mesh(p, 4, 1).tp == 2);  // one rank per node: the measurement of tp across a link
  CHECK(resolve_mesh(p, 8, 4).tp == 2);  // inside a node as without the key
  p.tp = 6;
  std::string e;
  try {
    resolve_mesh(p, 12, 4);
  } catch (const std::exception& x) {
    e = x.what();
  }
  INFO(e);
  CHECK(contains(e, "parallel.tp=6 exceeds the 4 GPUs per node"));
  CHECK(contains(e, "parallel.tp_across_nodes needs tp a multiple of the GPUs per node"));
}

TEST_CASE("placement: groups inside nodes, and the groups that span them named", "[mesh][placement]") {
  // Two nodes of two ranks, tp 2 x dp 2: tp inside, dp across.
  MeshShape m;
  m.tp = 2;
  m.dp = 2;
  const std::string clean = format_placement(m, {"a", "a", "b", "b"});
  INFO(clean);
  CHECK(clean == "placement: 2 nodes (a: ranks 0-1, b: ranks 2-3); tp groups inside nodes; dp_cp crosses nodes\n");
  // Two nodes of three ranks, tp 2 x dp 3: the middle tp group (ranks 2, 3) spans them.
  MeshShape odd;
  odd.tp = 2;
  odd.dp = 3;
  const std::string crossing = format_placement(odd, {"a", "a", "a", "b", "b", "b"});
  INFO(crossing);
  CHECK(crossing.find("placement: 2 nodes (a: ranks 0-2, b: ranks 3-5)") == 0);
  CHECK(crossing.find("warning: 1 of 3 tp groups span nodes (ranks 2-3 on a, b): tensor-parallel traffic crosses "
                      "the network; make parallel.tp divide the ranks per node\n") != std::string::npos);
  // pp 2 across two nodes, tp 2 inside.
  MeshShape pp;
  pp.tp = 2;
  pp.pp = 2;
  CHECK(format_placement(pp, {"a", "a", "b", "b"}) ==
        "placement: 2 nodes (a: ranks 0-1, b: ranks 2-3); tp groups inside nodes; pp crosses nodes\n");
}

TEST_CASE("link report: each group inside a node or across, measured next to the planner's", "[mesh][placement]") {
  // tp 2 inside two nodes x dp 2 across them, rank 0's view.
  MeshShape m;
  m.tp = 2;
  m.dp = 2;
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  const std::vector<LinkUse> measured = {{"tp", 2, 166912, 0.0567}, {"dp_cp", 2, 70272, 0.0093}, {"edp", 2, 0, 0}};
  std::string json;
  const std::string alone = format_link_report(m, 0, hosts, measured, nullptr, nullptr, &json);
  INFO(alone);
  CHECK(alone == "links per step, rank 0 (2 nodes): tp inside node a: 166912 B in 56.7 ms; dp_cp across nodes: "
                 "70272 B in 9.300 ms (7.6 MB/s)\n");  // edp moved nothing and has no plan: left out
  CHECK(json.find("\"dp_cp\": {\"across_nodes\": true, \"bytes\": 70272") != std::string::npos);
  // With the planner's groups of stage 0.
  StepEstimate e;
  GroupTime tp, dp;
  tp.label = "tp", tp.payload = 166912, tp.seconds = 0.000083;
  dp.label = "dp_cp", dp.payload = 70272, dp.seconds = 0.001124;
  e.stage_groups = {{tp, dp}};
  Hardware hw;
  hw.name = "netns";
  hw.nvlink_gb_s = 4;
  hw.network_gbit_s = 0.5;
  hw.gpus_per_node = 2;
  const std::string both = format_link_report(m, 0, hosts, measured, &e, &hw, &json);
  INFO(both);
  CHECK(both.find("links per step, planner on hardware 'netns' (in-node 4 GB/s, network 0.5 Gbit/s per rank, 2 per "
                  "node): tp 166912 B in 0.083 ms; dp_cp 70272 B in 1.124 ms\n") != std::string::npos);
  CHECK(json.find("\"planned_bytes\": 70272") != std::string::npos);
  // The step model's line.
  e.step_s = 0.0521, e.compute_s = 0.0302, e.exposed_comm_s = 0.02, e.idle_s = 0.0014, e.optimizer_s = 0.0005;
  const std::string model = format_step_model(e, hw, 0.0613, 12, &json);
  CHECK(model == "step time model on hardware 'netns': predicted 52.1 ms (compute 30.2 + exposed communication 20.0 + "
                 "idle 1.4 + optimizer 0.5); measured 61.3 ms per step (rank 0, mean of 12 steps)\n");
  CHECK(json.find("\"predicted_ms\": 52.1000") != std::string::npos);
  CHECK(json.find("\"measured_ms\": 61.3000") != std::string::npos);
  // A pipeline: the simulated bubble on the line, each stage's idle in the record.
  e.pipeline_s = 0.05, e.bubble = 0.25, e.stage_idle_s = {0.015, 0.010};
  const std::string piped = format_step_model(e, hw, 0.0613, 12, &json);
  CHECK(piped.find("(rank 0, mean of 12 steps); pipeline bubble 25.0% of the simulated schedule, links included\n") !=
        std::string::npos);
  CHECK(json.find("\"pipeline_bubble\": 0.2500, \"pipeline_ms\": 50.0000, \"pipeline_idle_ms\": [15.0000, 10.0000]}}") !=
        std::string::npos);
}
