// Pipeline parallelism through the real binary on CPU processes over Gloo:
// 20 steps of pp 2 and pp 4 with GPipe, 1F1B, interleaved and ZB-H1 at 4
// and 8 micro-batches,
// an uneven layer split, gpt2 with a tied embedding on the first and last
// stage, MoE, and pp 2 x tp 2 x dp 2 on 8 ranks (mpirun) reproduce the
// one-process run (losses, validation losses, final weights); a checkpoint
// of pp 2 resumes in one process and then at pp 4 on the same curve; the
// smoke test runs on every rank of a pipeline.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;
using e2e::losses;
using e2e::max_rel_diff;
using e2e::metric;
using e2e::run;
using e2e::Setup;

namespace {

const char* const kLlama =
    "{arch: llama, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";
// 8 layers: pp 4 x 2 chunks gives every virtual stage one.
const char* const kLlama8 =
    "{arch: llama, d_model: 32, n_layers: 8, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";
const char* const kGpt2Tied =
    "{arch: gpt2, vocab_size: 259, d_model: 32, n_layers: 4, n_heads: 4, tie_embeddings: true, max_seq_len: 32}";
const char* const kMoe =
    "{arch: llama, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 32}}";

Setup make_setup(const std::string& name, const char* model) { return e2e::make_setup("pp", name, model); }

void expect_same_run(const Setup& s, const std::string& label, const std::string& run_dir) {
  e2e::expect_same_run(s, "pp", label, run_dir);
}

// Every case must say it ran the layout asked for.
void run_cases(const Setup& s, const std::vector<e2e::Case>& cases) {
  e2e::run_cases(s, "pp", cases, {"pipeline: ", "pipeline idle (waiting for neighbours) per stage"});
}

}  // namespace

TEST_CASE("pipeline parallel llama: pp 2 and 4, GPipe, 1F1B, interleaved and ZB-H1, 4 and 8 micro-batches == one process",
          "[pp][e2e]") {
  const Setup s = make_setup("llama", kLlama);
  run_cases(s, {
                   {"llama pp2 gpipe m4", 2, "--set parallel.pp=2 --set parallel.pp_schedule=gpipe"},
                   {"llama pp2 1f1b m4", 2, "--set parallel.pp=2"},
                   {"llama pp2 gpipe m8", 2, "--set parallel.pp=2 --set parallel.pp_schedule=gpipe --set train.micro_batch_size=1"},
                   {"llama pp2 1f1b m8", 2, "--set parallel.pp=2 --set train.micro_batch_size=1"},
                   {"llama pp4 gpipe m4", 4, "--set parallel.pp=4 --set parallel.pp_schedule=gpipe"},
                   {"llama pp4 1f1b m4", 4, "--set parallel.pp=4"},
                   {"llama pp4 gpipe m8", 4, "--set parallel.pp=4 --set parallel.pp_schedule=gpipe --set train.micro_batch_size=1"},
                   {"llama pp4 1f1b m8", 4, "--set parallel.pp=4 --set train.micro_batch_size=1"},
                   {"llama pp2 layers 1+3", 2, "--set parallel.pp=2 --set parallel.pp_layers=[1,3]"},
                   // 2 chunks per rank: virtual stages 0, 2 on rank 0 and 1, 3 on rank 1.
                   {"llama pp2 interleaved m4", 2, "--set parallel.pp=2 --set parallel.pp_schedule=interleaved"},
                   {"llama pp2 interleaved m8", 2, "--set parallel.pp=2 --set parallel.pp_schedule=interleaved --set train.micro_batch_size=1"},
                   {"llama pp2 zb-h1 m4", 2, "--set parallel.pp=2 --set parallel.pp_schedule=zb-h1"},
                   {"llama pp2 zb-h1 m8", 2, "--set parallel.pp=2 --set parallel.pp_schedule=zb-h1 --set train.micro_batch_size=1"},
                   {"llama pp4 zb-h1 m4", 4, "--set parallel.pp=4 --set parallel.pp_schedule=zb-h1"},
                   {"llama pp4 zb-h1 m8", 4, "--set parallel.pp=4 --set parallel.pp_schedule=zb-h1 --set train.micro_batch_size=1"},
               });
  fs::remove_all(s.dir);
}

TEST_CASE("pipeline parallel pp 4 interleaved (8 virtual stages) at 4 and 8 micro-batches == one process", "[pp][e2e]") {
  const Setup s = make_setup("llama8", kLlama8);
  run_cases(s, {
                   {"llama8 pp4 interleaved m4", 4, "--set parallel.pp=4 --set parallel.pp_schedule=interleaved"},
                   {"llama8 pp4 interleaved m8", 4,
                    "--set parallel.pp=4 --set parallel.pp_schedule=interleaved --set train.micro_batch_size=1"},
               });
  fs::remove_all(s.dir);
}

TEST_CASE("pipeline parallel pp 2 x tp 2 x dp 2 on 8 ranks (mpirun), ZeRO-1, sp == one process", "[pp][tp][e2e]") {
  const Setup s = make_setup("3d", kLlama);
  std::string out;
  const std::string rd = (s.dir / "mpirun").string();
  const int rc = run("mpirun --allow-run-as-root --oversubscribe -np 8 -x MASTER_PORT=" +
                         std::to_string(e2e::free_port()) + " " + TRAINER_BIN + " --config " + s.cfg +
                         " --set run.dir=" + rd +
                         " --set parallel.pp=2 --set parallel.tp=2 --set parallel.sp=true --set parallel.zero_stage=1",
                     &out);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  CHECK(out.find("tensor parallel 2 with sp, data parallel 2, ZeRO stage 1") != std::string::npos);
  expect_same_run(s, "mpirun pp2 tp2 dp2 zero1 sp", rd);
  fs::remove_all(s.dir);
}

TEST_CASE("pipeline parallel gpt2 with the tied embedding on both ends, and MoE == one process", "[pp][e2e]") {
  {
    const Setup s = make_setup("gpt2", kGpt2Tied);
    run_cases(s, {{"gpt2 tied pp2", 2, "--set parallel.pp=2"},
                  {"gpt2 tied pp2 x dp2 zero1", 4, "--set parallel.pp=2 --set parallel.zero_stage=1"},
                  // The tied table on rank 0's first chunk and rank 1's last.
                  {"gpt2 tied pp2 interleaved", 2, "--set parallel.pp=2 --set parallel.pp_schedule=interleaved"},
                  {"gpt2 tied pp2 zb-h1", 2, "--set parallel.pp=2 --set parallel.pp_schedule=zb-h1"}});
    fs::remove_all(s.dir);
  }
  {
    const Setup s = make_setup("moe", kMoe);
    run_cases(s, {{"moe pp2", 2, "--set parallel.pp=2"},
                  // The split under tensor parallelism too: stashed gradients of the whole sequence (sp).
                  {"moe pp2 x tp2 sp zb-h1", 4,
                   "--set parallel.pp=2 --set parallel.tp=2 --set parallel.sp=true --set parallel.pp_schedule=zb-h1"}});
    fs::remove_all(s.dir);
  }
}

TEST_CASE("a checkpoint of pp 2 resumes in one process, then at pp 4, on the same curve", "[pp][reshard][e2e]") {
  const Setup s = make_setup("reshard", kGpt2Tied);
  const auto straight = losses(fs::path(s.single()) / "metrics.jsonl");
  REQUIRE(straight.size() == 20);
  const std::string a = (s.dir / "a").string(), b = (s.dir / "b").string(), c = (s.dir / "c").string();
  std::string out;
  REQUIRE(e2e::run_by_hand(s.cfg, 2, a, &out, "--set parallel.pp=2 --stop-after 7") == 0);
  out.clear();
  REQUIRE(run(std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + b + " --stop-after 14" +
                  " --set checkpoint.resume=" + a + "/ckpt/step_00000007",
              &out) == 0);
  CHECK(out.find("resumed from " + a + "/ckpt/step_00000007 at step 7") != std::string::npos);
  out.clear();
  const int rc = e2e::run_by_hand(s.cfg, 4, c, &out, "--set parallel.pp=4 --set checkpoint.resume=" + b + "/ckpt/step_00000014");
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  CHECK(out.find("resumed from " + b + "/ckpt/step_00000014 at step 14") != std::string::npos);
  const std::vector<double> joined = e2e::joined_losses({a, b, c});
  REQUIRE(joined.size() == 20);
  const double worst = max_rel_diff(joined, straight);
  const double w = e2e::weight_diff(fs::path(s.single()) / "ckpt/step_00000020", fs::path(c) / "ckpt/step_00000020");
  std::printf("[pp] reshard pp2 -> 1 -> pp4: losses max rel diff %.2e (tol 1e-5), final weights rel L2 %.2e (tol 1e-4)\n",
              worst, w);
  CHECK(worst < 1e-5);
  CHECK(w < 1e-4);
  fs::remove_all(s.dir);
}

TEST_CASE("the smoke test runs on every rank of a pp 2 x dp 2 pipeline and they agree", "[pp][smoke][e2e]") {
  const Setup s = make_setup("smoke", kLlama);
  std::string out;
  const std::string rd = (s.dir / "smoke").string();
  std::vector<int> code;
  e2e::run_by_hand(s.cfg, 4, rd, &out, "--set parallel.pp=2 --set parallel.zero_stage=1 --set train.steps=40 --smoke-test",
                   &code);
  std::ifstream in(rd + ".rank0.log");
  const std::string log0((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(e2e::tail(out));
  std::printf("[pp] smoke test, pp 2 x dp 2: rank exits %d %d %d %d\n", code[0], code[1], code[2], code[3]);
  CHECK(log0.find("smoke test: 40 steps") != std::string::npos);
  e2e::check_smoke(log0, code);
  fs::remove_all(s.dir);
}
