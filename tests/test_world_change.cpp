// The line a resume prints when the world changed (train/world_change.h):
// nothing when it did not, and what changed and why when an elastic restart
// shrank or grew the job.
#include <catch2/catch.hpp>

#include <cstdio>

#include "train/world_change.h"

using namespace trainer;
using Catch::Matchers::Contains;

namespace {

Config two_node_config() {
  Config c;
  c.parallel.tp = 2;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 8;
  return c;
}

CheckpointMeta saved_by(int world, int nodes, const std::string& layout) {
  CheckpointMeta m;
  m.step = 4;
  m.world_size = world;
  m.nodes = nodes;
  m.layout = layout;
  return m;
}

LaunchInfo torchrun(int world, int restart) {
  LaunchInfo l;
  l.launcher = "torchrun";
  l.world_size = world;
  l.restart_count = restart;
  return l;
}

}  // namespace

TEST_CASE("world change: none when the world and layout are the checkpoint's", "[world_change]") {
  const Config c = two_node_config();
  CHECK(describe_world_change(saved_by(4, 2, "tp2.pp1.dp2.cp1.ep1.zero0"), c, torchrun(4, 1), 2, 2, 2).empty());
}

TEST_CASE("world change: a lost node and its return under torchrun", "[world_change]") {
  const Config c = two_node_config();
  const std::string shrink =
      describe_world_change(saved_by(4, 2, "tp2.pp1.dp2.cp1.ep1.zero0"), c, torchrun(2, 1), 1, 1, 1);
  std::printf("[world_change] %s", shrink.c_str());
  CHECK_THAT(shrink, Contains("world: 2 ranks on 1 node now; the checkpoint of step 4 was written by 4 ranks on 2 nodes"));
  CHECK_THAT(shrink, Contains("tp2.pp1.dp2.cp1.ep1.zero0 -> tp2.pp1.dp1.cp1.ep1.zero0"));
  CHECK_THAT(shrink, Contains("data parallel 2 -> 1, the global batch of 8 sequences kept by 4 micro-batches of 2 per "
                              "rank (was 2)"));
  CHECK_THAT(shrink, Contains("why: torchrun restart 1 admitted 1 node (2 before): a node was lost or left the job"));
  const std::string grow =
      describe_world_change(saved_by(2, 1, "tp2.pp1.dp1.cp1.ep1.zero0"), c, torchrun(4, 2), 2, 2, 2);
  std::printf("[world_change] %s", grow.c_str());
  CHECK_THAT(grow, Contains("data parallel 1 -> 2") && Contains("kept by 2 micro-batches of 2 per rank (was 4)"));
  CHECK_THAT(grow, Contains("torchrun restart 2 admitted 2 nodes (1 before): a node joined or came back"));
}

TEST_CASE("world change: another launcher and an older manifest without nodes", "[world_change]") {
  const Config c = two_node_config();
  LaunchInfo mpi;
  mpi.launcher = "mpirun";
  mpi.world_size = 2;
  const std::string s = describe_world_change(saved_by(4, 0, "tp2.pp1.dp2.cp1.ep1.zero0"), c, mpi, 1, 1, 0);
  CHECK_THAT(s, Contains("written by 4 ranks (tp2"));  // no node count to state
  CHECK_THAT(s, Contains("why: the launcher (mpirun) started 2 ranks where the checkpoint had 4"));
}

TEST_CASE("world change: the same world on another layout says the configuration changed", "[world_change]") {
  Config c = two_node_config();
  c.parallel.tp = 1;
  const std::string s = describe_world_change(saved_by(4, 2, "tp2.pp1.dp2.cp1.ep1.zero0"), c, torchrun(4, 0), 2, 4, 2);
  CHECK_THAT(s, Contains("(tp2.pp1.dp2.cp1.ep1.zero0 -> tp1.pp1.dp4.cp1.ep1.zero0): data parallel 2 -> 4"));
  CHECK_THAT(s, Contains("why: the configuration's parallel layout differs from the checkpoint's"));
}
