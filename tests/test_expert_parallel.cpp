// Expert parallelism through the real binary on CPU processes over Gloo: 20
// steps of ep 2 and ep 4 (dp 4), dropless and with a capacity factor, both
// architectures, ep 2 x tp 2, ep 2 with ZeRO-3 over the expert data-parallel
// group, ep 2 inside a pipeline stage and under ZB-H1 reproduce the
// one-process run (losses, validation losses, final weights); a checkpoint
// of ep 2 resumes in one process on the same curve.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;
using e2e::Setup;

namespace {

const char* const kMoe =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 32}}";
// A capacity below the demand of a skewed router: tokens are dropped at
// their source rank exactly as in the one-process run.
const char* const kMoeCapacity =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 32, capacity_factor: 0.75}}";
const char* const kGpt2Moe =
    "{arch: gpt2, vocab_size: 259, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32, "
    "moe: {num_experts: 8, top_k: 2, d_ff: 32, every: 2}}";

void run_cases(const Setup& s, const std::vector<e2e::Case>& cases) {
  e2e::run_cases(s, "ep", cases, {"expert parallel ", "moe load: layer "});
}

// The experts' load records of a run's metrics.jsonl ({"step": N, "moe": [...]}).
std::vector<std::string> load_records(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (line.find("\"moe\": [") != std::string::npos) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("expert parallel llama MoE: ep 2 and ep 4 over dp 4, with tp 2, ZeRO-3, pp 2 == one process", "[ep][e2e]") {
  const Setup s = e2e::make_setup("ep", "moe", kMoe);
  run_cases(s, {
                   {"moe ep2 dp2", 2, "--set parallel.ep=2"},
                   {"moe ep2 dp4", 4, "--set parallel.ep=2"},
                   {"moe ep4 dp4", 4, "--set parallel.ep=4"},
                   {"moe ep2 x tp2", 4, "--set parallel.ep=2 --set parallel.tp=2 --set parallel.sp=true"},
                   {"moe ep2 dp4 zero3", 4, "--set parallel.ep=2 --set parallel.zero_stage=3"},
                   {"moe ep2 pp2 zb-h1", 4, "--set parallel.ep=2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1"},
               });
  fs::remove_all(s.dir);
}

TEST_CASE("expert parallel with a capacity factor drops the one-process run's tokens: ep 2, ep 4", "[ep][e2e]") {
  const Setup s = e2e::make_setup("ep", "capacity", kMoeCapacity);
  run_cases(s, {
                   {"capacity ep2 dp2", 2, "--set parallel.ep=2"},
                   {"capacity ep4 dp4 zero1", 4, "--set parallel.ep=4 --set parallel.zero_stage=1"},
               });
  // The same tokens per expert and the same drops as one process, every
  // step: the capacity applies per source rank as it does per micro-batch.
  const auto one = load_records(fs::path(s.single()) / "metrics.jsonl");
  const auto ep4 = load_records(s.dir / "capacity_ep4_dp4_zero1" / "metrics.jsonl");
  REQUIRE(one.size() == 20);
  CHECK(ep4 == one);
  const std::string& last = one.back();
  std::printf("[ep] capacity 0.75, expert load at step 20 (one process and ep 4 alike): %s\n", last.c_str());
  CHECK(last.find("\"dropped\": 0,") == std::string::npos);  // the capacity did drop
  fs::remove_all(s.dir);
}

TEST_CASE("expert parallel gpt2 MoE (8 experts every second layer): ep 2 and ep 4 == one process", "[ep][e2e]") {
  const Setup s = e2e::make_setup("ep", "gpt2", kGpt2Moe);
  run_cases(s, {
                   {"gpt2 moe ep2 dp2", 2, "--set parallel.ep=2"},
                   {"gpt2 moe ep4 dp4 zero2", 4, "--set parallel.ep=4 --set parallel.zero_stage=2"},
               });
  fs::remove_all(s.dir);
}

TEST_CASE("a checkpoint of ep 2 x dp 2 resumes in one process (ep 1) on the same curve", "[ep][reshard][e2e]") {
  const Setup s = e2e::make_setup("ep", "reshard", kMoe);
  e2e::check_reshard_to_one(s, "ep", "ep2 dp2 zero1", 2, "--set parallel.ep=2 --set parallel.zero_stage=1");
  fs::remove_all(s.dir);
}

TEST_CASE("expert-parallel configuration mistakes exit 2 naming the keys", "[ep][cli][config]") {
  const std::string moe = " --set model.moe.num_experts=4 --set model.moe.top_k=2";
  e2e::expect_config_errors({
      {"--world 4 --set parallel.ep=3" + moe, "parallel.ep=3 must divide data-parallel x parallel.cp = 4 x 1"},
      {"--world 4 --set parallel.ep=4 --set model.moe.num_experts=6 --set model.moe.top_k=2",
       "model.moe.num_experts=6 must be divisible by parallel.ep=4"},
      {"--world 2 --set parallel.ep=2", "parallel.ep=2 splits experts, but model.moe.num_experts=0"},
  });
}
