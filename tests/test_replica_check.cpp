// Copies that must be identical (train/replica_check.h, issue 45 item 1):
// the verdict on hand-made records (majority, two copies with a shard owner,
// a rank in two disagreeing pairs, two copies with nothing to tell them
// apart), then through the real binary: one bit of final_norm.weight flipped
// on one rank after an update (TRAINER_TEST_HOOKS flip_bit), caught at the
// next check in dp2 (ZeRO-1 and ZeRO-0), tp2 and dp2 x tp2 x pp2, the rank
// named, the run stopped with exit 5 or rolled back, and no checkpoint
// written after the flip before the check.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "train/replica_check.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

ReplicaRecord rec(ReplicaGroup g, int set, int param, int rank, uint64_t hash, int owner = -1) {
  ReplicaRecord r;
  r.group = uint64_t(g);
  r.set = uint64_t(set);
  r.param = uint64_t(param);
  r.rank = rank;
  r.hash = hash;
  r.owner = owner;
  return r;
}

const std::vector<std::string> kNames = {"embedding.weight", "layers.0.attn_norm.weight", "final_norm.weight"};
const std::vector<std::string> kHosts = {"node-a", "node-a", "node-b", "node-b"};

}  // namespace

TEST_CASE("replica verdict: majority, shard owner, a rank in two pairs, and two copies it cannot tell apart",
          "[replica]") {
  using G = ReplicaGroup;
  // Everything agrees.
  ReplicaVerdict v = judge_replicas({rec(G::DataParallel, 0, 0, 0, 7), rec(G::DataParallel, 0, 0, 1, 7)}, kNames, kHosts);
  CHECK(v.ok);
  CHECK(v.sets == 1);
  CHECK(v.pieces == 2);
  // Three copies, rank 2 alone: the majority names it, with its node and the first tensor.
  v = judge_replicas({rec(G::DataParallel, 0, 2, 0, 7), rec(G::DataParallel, 0, 2, 1, 7), rec(G::DataParallel, 0, 2, 2, 9),
                      rec(G::DataParallel, 0, 0, 0, 1), rec(G::DataParallel, 0, 0, 1, 1), rec(G::DataParallel, 0, 0, 2, 1)},
                     kNames, kHosts);
  std::printf("[replica] %s\n", v.message.c_str());
  REQUIRE(!v.ok);
  CHECK(v.ranks == std::vector<int>{2});
  CHECK(v.message.find("rank 2 on node-b") != std::string::npos);
  CHECK(v.message.find("'final_norm.weight'") != std::string::npos);
  CHECK(v.message.find("majority") != std::string::npos);
  // Two copies of a ZeRO piece: the one that differs from its owner's.
  v = judge_replicas({rec(G::DataParallel, 0, 2, 0, 7, 0), rec(G::DataParallel, 0, 2, 1, 9, 0)}, kNames, kHosts);
  std::printf("[replica] %s\n", v.message.c_str());
  CHECK(v.ranks == std::vector<int>{1});
  CHECK(v.message.find("owner") != std::string::npos);
  // Rank 3 in its dp pair {1, 3} and its tp pair {2, 3}: the one rank in both.
  v = judge_replicas({rec(G::DataParallel, 1, 2, 1, 7), rec(G::DataParallel, 1, 2, 3, 9), rec(G::TensorParallel, 2, 2, 2, 7),
                      rec(G::TensorParallel, 2, 2, 3, 9), rec(G::TensorParallel, 0, 2, 0, 7), rec(G::TensorParallel, 0, 2, 1, 7)},
                     kNames, kHosts);
  std::printf("[replica] %s\n", v.message.c_str());
  CHECK(v.ranks == std::vector<int>{3});
  CHECK(v.message.find("every set that disagrees") != std::string::npos);
  // Two copies, no owner, no second pair: both named, and the message says why.
  v = judge_replicas({rec(G::TensorParallel, 0, 1, 0, 7), rec(G::TensorParallel, 0, 1, 1, 9)}, kNames, kHosts);
  std::printf("[replica] %s\n", v.message.c_str());
  CHECK(v.ranks == std::vector<int>{0, 1});
  CHECK(v.message.find("cannot tell") != std::string::npos);
  CHECK(v.message.find("'layers.0.attn_norm.weight'") != std::string::npos);
  // A piece only one rank holds is no set of copies.
  v = judge_replicas({rec(G::PipelineEnds, 0, 0, 0, 7), rec(G::PipelineEnds, 4, 0, 4, 9)}, kNames, kHosts);
  CHECK(v.ok);
}

namespace {

const char* const kLlama =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";

// A run with one bit flipped on `rank` after step `at`; returns every rank's exit code.
std::vector<int> flipped_run(const e2e::Setup& s, const std::string& dir, int world, int rank, int at,
                             const std::string& extra, std::string& out) {
  setenv("TRAINER_TEST_HOOKS", ("flip_bit=" + std::to_string(rank) + ":" + std::to_string(at)).c_str(), 1);
  std::vector<int> codes;
  e2e::run_by_hand(s.cfg, world, dir, &out,
                   "--set train.replica_check_interval=5 --set checkpoint.interval=5 " + extra, &codes);
  unsetenv("TRAINER_TEST_HOOKS");
  return codes;
}

// The "replicas disagree: ..." line of the output.
std::string verdict_line(const std::string& out) {
  const size_t at = out.find("replicas disagree: ");
  if (at == std::string::npos) return "";
  return out.substr(at, out.find('\n', at) - at);
}

}  // namespace

TEST_CASE("a flipped bit on one rank is caught at the next replica check: dp2 (ZeRO-1, ZeRO-0), tp2, dp2 x tp2 x pp2",
          "[replica][e2e]") {
  const e2e::Setup s = e2e::make_setup("replica", "flip", kLlama);
  SECTION("dp2 ZeRO-1: the copy that differs from the shard owner's, exit 5, no checkpoint of that step") {
    // final_norm.weight[0] lies in the head unit's first shard: rank 0 owns it, rank 1 holds a gathered copy.
    // The next step's gather would rewrite that copy, so the flip is at a check step.
    std::string out;
    const std::string dir = (s.dir / "dp2_zero1").string();
    const auto codes = flipped_run(s, dir, 2, 1, 10, "--set parallel.zero_stage=1", out);
    const std::string line = verdict_line(out);
    std::printf("[replica] dp2 ZeRO-1, bit flipped on rank 1 after step 10: exit codes %d %d; %s\n", codes.at(0),
                codes.at(1), line.c_str());
    INFO(e2e::tail(out));
    CHECK(codes == std::vector<int>{kReplicaMismatchExitCode, kReplicaMismatchExitCode});
    CHECK(line.find("rank 1 on ") != std::string::npos);
    CHECK(line.find("'final_norm.weight'") != std::string::npos);
    CHECK(out.find("step 10: replicas disagree") != std::string::npos);
    CHECK(fs::exists(fs::path(dir) / "ckpt/step_00000005"));
    CHECK(!fs::exists(fs::path(dir) / "ckpt/step_00000010"));
  }
  SECTION("dp2 ZeRO-0 with rollback: the flip persists until the check, the run goes back to step 5 and ends") {
    std::string out;
    const std::string dir = (s.dir / "dp2_zero0").string();
    const auto codes = flipped_run(s, dir, 2, 1, 7, "--set parallel.zero_stage=0 --set train.replica_policy=rollback", out);
    const std::string line = verdict_line(out);
    std::printf("[replica] dp2 ZeRO-0, bit flipped on rank 1 after step 7, caught at step 10: exit codes %d %d; %s\n",
                codes.at(0), codes.at(1), line.c_str());
    INFO(e2e::tail(out));
    CHECK(codes == std::vector<int>{0, 0});
    // Two full replicas and no owner: both are named, and the message says it cannot tell.
    CHECK(line.find("ranks 0 on ") != std::string::npos);
    CHECK(line.find("cannot tell") != std::string::npos);
    CHECK(out.find("step 10: replicas disagree") != std::string::npos);
    CHECK(out.find("rolled back to " + dir + "/ckpt/step_00000005 (step 5)") != std::string::npos);
    CHECK(fs::exists(fs::path(dir) / "ckpt/step_00000020"));
  }
  SECTION("tp2: the norm's two copies, both named") {
    std::string out;
    const auto codes = flipped_run(s, (s.dir / "tp2").string(), 2, 1, 7, "--set parallel.tp=2", out);
    const std::string line = verdict_line(out);
    std::printf("[replica] tp2, bit flipped on rank 1 after step 7, checked at step 10: exit codes %d %d; %s\n",
                codes.at(0), codes.at(1), line.c_str());
    INFO(e2e::tail(out));
    CHECK(codes == std::vector<int>{kReplicaMismatchExitCode, kReplicaMismatchExitCode});
    CHECK(line.find("tensor-parallel copies") != std::string::npos);
    CHECK(line.find("ranks 0 on ") != std::string::npos);
    CHECK(line.find(", 1 on ") != std::string::npos);
  }
  SECTION("dp2 x tp2 x pp2: the one rank in both disagreeing pairs") {
    // Ranks 4-7 are the last stage (pp outermost), which holds final_norm.weight; rank 5 owns
    // element 0's ZeRO shard in its dp pair, rank 6 does not. At a check step: the next step's
    // gather would rewrite the dp copy, after which only the tp pairs would differ.
    for (int rank : {5, 6}) {
      std::string out;
      const auto codes = flipped_run(s, (s.dir / ("mesh_r" + std::to_string(rank))).string(), 8, rank, 10,
                                     "--set parallel.tp=2 --set parallel.pp=2 --set parallel.zero_stage=1", out);
      const std::string line = verdict_line(out);
      std::printf("[replica] dp2 x tp2 x pp2 ZeRO-1, bit flipped on rank %d after step 10: %s\n", rank, line.c_str());
      INFO(e2e::tail(out));
      CHECK(codes == std::vector<int>(8, kReplicaMismatchExitCode));
      CHECK(line.find("rank " + std::to_string(rank) + " on ") != std::string::npos);
      CHECK(line.find("every set that disagrees") != std::string::npos);
    }
  }
  fs::remove_all(s.dir);
}
