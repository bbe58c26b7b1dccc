// Context parallelism through the real binary on CPU processes over Gloo: 20
// steps of cp 2 and cp 4 (causal llama with grouped-query attention, gpt2
// with learned positions), cp 2 x tp 2 x dp 2 on 8 ranks with sp and ZeRO-1,
// cp 2 inside a pp 2 pipeline, and MoE under cp reproduce the one-process
// run (losses, validation losses, final weights); a checkpoint of cp 2
// resumes in one process on the same curve; a sliding window under cp 2 and
// cp 4 (blocks outside the window skipped) reproduces one process too.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;
using e2e::Setup;

namespace {

const char* const kLlamaGqa =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";
const char* const kGpt2 = "{arch: gpt2, vocab_size: 259, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32}";
// With the load-balancing loss, whole-sequence under cp (model/moe_routing_plan.h;
// tests/test_moe_layouts.cpp has every split layout with and without a capacity).
const char* const kMoe =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 32, aux_loss_coeff: 0.01}}";

void run_cases(const Setup& s, const std::vector<e2e::Case>& cases) {
  e2e::run_cases(s, "cp", cases, {"context parallel "});
}

}  // namespace

TEST_CASE("context parallel llama GQA: cp 2, cp 4, cp 2 x tp 2 x dp 2, cp 2 x pp 2 == one process", "[cp][e2e]") {
  const Setup s = e2e::make_setup("cp", "llama", kLlamaGqa);
  run_cases(s, {
                   {"llama cp2", 2, "--set parallel.cp=2"},
                   {"llama cp4", 4, "--set parallel.cp=4"},
                   {"llama cp2 dp2 zero1", 4, "--set parallel.cp=2 --set parallel.zero_stage=1"},
                   {"llama cp2 x tp2 sp x dp2", 8,
                    "--set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true --set parallel.zero_stage=1"},
                   {"llama cp2 x pp2", 4, "--set parallel.cp=2 --set parallel.pp=2"},
               });
  fs::remove_all(s.dir);
}

TEST_CASE("context parallel llama with a sliding window: cp 2 and cp 4 == one process", "[cp][e2e][window]") {
  // A window of 3 over 32 tokens: at cp 2 every block pair still meets, at
  // cp 4 (chunks of 4) ranks 0 and 2 never see each other's keys and the
  // ring skips those blocks (model/context_parallel.h).
  const Setup s = e2e::make_setup("cp", "window", std::string(kLlamaGqa).insert(std::strlen(kLlamaGqa) - 1,
                                                                                 ", sliding_window: 3"));
  run_cases(s, {{"llama window cp2", 2, "--set parallel.cp=2"}, {"llama window cp4", 4, "--set parallel.cp=4"}});
  fs::remove_all(s.dir);
}

TEST_CASE("context parallel gpt2 (learned positions) and MoE: cp 2 == one process", "[cp][e2e]") {
  {
    const Setup s = e2e::make_setup("cp", "gpt2", kGpt2);
    run_cases(s, {{"gpt2 cp2", 2, "--set parallel.cp=2"}, {"gpt2 cp4 zero2", 4, "--set parallel.cp=4 --set parallel.zero_stage=2"}});
    fs::remove_all(s.dir);
  }
  {
    const Setup s = e2e::make_setup("cp", "moe", kMoe);
    run_cases(s, {{"moe cp2 ep2", 2, "--set parallel.cp=2 --set parallel.ep=2"}});
    fs::remove_all(s.dir);
  }
}

TEST_CASE("a checkpoint of cp 2 x dp 2 resumes in one process (cp 1) on the same curve", "[cp][reshard][e2e]") {
  const Setup s = e2e::make_setup("cp", "reshard", kLlamaGqa);
  e2e::check_reshard_to_one(s, "cp", "cp2 dp2 zero1", 4, "--set parallel.cp=2 --set parallel.zero_stage=1");
  fs::remove_all(s.dir);
}

TEST_CASE("context-parallel configuration mistakes exit 2 naming the keys", "[cp][cli][config]") {
  // configs/tiny.yaml: seq_len 64.
  e2e::expect_config_errors({
      {"--world 3 --set parallel.cp=3", "train.seq_len=64 must be divisible by 2 x parallel.cp=3 = 6"},
      {"--world 2 --set parallel.cp=2 --set train.seq_len=34", "train.seq_len=34 must be divisible by 2 x parallel.cp=2 = 4"},
      {"--world 8 --set parallel.cp=2 --set parallel.tp=4 --set parallel.sp=true --set train.seq_len=36",
       "train.seq_len=36 / parallel.cp=2 must be divisible by parallel.tp=4"},
  });
}
