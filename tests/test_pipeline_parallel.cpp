// Pipeline parallelism through the real binary on CPU processes over Gloo:
// 20 steps of pp 2 and pp 4 with GPipe and 1F1B at 4 and 8 micro-batches,
// an uneven layer split, gpt2 with a tied embedding on the first and last
// stage, MoE, and pp 2 x tp 2 x dp 2 on 8 ranks (mpirun) reproduce the
// one-process run (losses, validation losses, final weights); a checkpoint
// of pp 2 resumes in one process and then at pp 4 on the same curve; the
// smoke test runs on every rank of a pipeline.
#include <catch2/catch.hpp>

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

namespace {

const char* const kLlama =
    "{arch: llama, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";
const char* const kGpt2Tied =
    "{arch: gpt2, vocab_size: 259, d_model: 32, n_layers: 4, n_heads: 4, tie_embeddings: true, max_seq_len: 32}";
const char* const kMoe =
    "{arch: llama, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 32}}";

struct Setup {
  fs::path dir;
  std::string cfg;
  std::string single() const { return (dir / "single").string(); }
};

// 8 sequences of 32 tokens a step; micro-batches of 2 (m = 4) unless a case
// sets 1 (m = 8); evaluation at steps 10 and 20.
Setup make_setup(const std::string& name, const char* model) {
  Setup s;
  s.dir = fs::temp_directory_path() / ("trainer_pp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(s.dir);
  fs::create_directories(s.dir);
  const fs::path tokens = e2e::write_byte_tokens(s.dir);
  s.cfg = (s.dir / "cfg.yaml").string();
  std::ofstream(s.cfg) << "run: {name: pp}\n"
                       << "model: " << model << "\n"
                       << "train: {steps: 20, seq_len: 32, micro_batch_size: 2, global_batch_size: 8, "
                          "eval_interval: 10, eval_steps: 1}\n"
                       << "optim: {lr: 3.0e-3, warmup_steps: 3}\n"
                       << "data: {train: [" << tokens.string() << "], valid: [" << tokens.string() << "]}\n"
                       << "checkpoint: {interval: 20}\n"
                       << "log: {interval: 1, progress: lines}\n"
                       << "parallel: {timeout_s: 60}\n";
  std::string out;
  const int rc = run(std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + s.single(), &out);
  INFO(out);
  REQUIRE(rc == 0);
  return s;
}

void expect_same_run(const Setup& s, const std::string& label, const std::string& run_dir) {
  const auto a = losses(fs::path(s.single()) / "metrics.jsonl"), b = losses(fs::path(run_dir) / "metrics.jsonl");
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  const auto va = metric(fs::path(s.single()) / "metrics.jsonl", "val_loss"),
             vb = metric(fs::path(run_dir) / "metrics.jsonl", "val_loss");
  REQUIRE(va.size() == 2);
  REQUIRE(vb.size() == 2);
  const double worst = max_rel_diff(b, a), vworst = max_rel_diff(vb, va);
  const double w = e2e::weight_diff(fs::path(s.single()) / "ckpt/step_00000020", fs::path(run_dir) / "ckpt/step_00000020");
  std::printf("[pp] %-36s losses max rel diff %.2e, val %.2e (tol 1e-5), final weights %.2e (tol 1e-4)\n",
              label.c_str(), worst, vworst, w);
  CHECK(worst < 1e-5);
  CHECK(vworst < 1e-5);
  CHECK(w < 1e-4);
}

struct Case {
  const char* label;
  int world;
  const char* set;
};

void run_cases(const Setup& s, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    std::string out, dir_name = c.label;
    std::replace(dir_name.begin(), dir_name.end(), ' ', '_');
    const std::string rd = (s.dir / dir_name).string();
    const int rc = e2e::run_by_hand(s.cfg, c.world, rd, &out, c.set);
    INFO(c.label << "\n" << out);
    REQUIRE(rc == 0);
    CHECK(out.find("pipeline: ") != std::string::npos);
    CHECK(out.find("pipeline idle (waiting for neighbours) per stage") != std::string::npos);
    expect_same_run(s, c.label, rd);
  }
}

}  // namespace

TEST_CASE("pipeline parallel llama: pp 2 and 4, GPipe and 1F1B, 4 and 8 micro-batches == one process",
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
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("tensor parallel 2 with sp, data parallel 2, ZeRO stage 1") != std::string::npos);
  expect_same_run(s, "mpirun pp2 tp2 dp2 zero1 sp", rd);
  fs::remove_all(s.dir);
}

TEST_CASE("pipeline parallel gpt2 with the tied embedding on both ends, and MoE == one process", "[pp][e2e]") {
  {
    const Setup s = make_setup("gpt2", kGpt2Tied);
    run_cases(s, {{"gpt2 tied pp2", 2, "--set parallel.pp=2"},
                  {"gpt2 tied pp2 x dp2 zero1", 4, "--set parallel.pp=2 --set parallel.zero_stage=1"}});
    fs::remove_all(s.dir);
  }
  {
    const Setup s = make_setup("moe", kMoe);
    run_cases(s, {{"moe pp2", 2, "--set parallel.pp=2"}});
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
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("resumed from " + b + "/ckpt/step_00000014 at step 14") != std::string::npos);
  std::vector<double> joined = losses(fs::path(a) / "metrics.jsonl");
  for (const std::string& d : {b, c}) {
    const auto part = losses(fs::path(d) / "metrics.jsonl");
    joined.insert(joined.end(), part.begin(), part.end());
  }
  REQUIRE(joined.size() == 20);
  const double worst = max_rel_diff(joined, straight);
  const double w = e2e::weight_diff(fs::path(s.single()) / "ckpt/step_00000020", fs::path(c) / "ckpt/step_00000020");
  std::printf("[pp] reshard pp2 -> 1 -> pp4: losses max rel diff %.2e (tol 1e-5), final weights %.2e (tol 1e-4)\n",
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
  INFO(out);
  std::printf("[pp] smoke test, pp 2 x dp 2: rank exits %d %d %d %d\n", code[0], code[1], code[2], code[3]);
  REQUIRE(code[0] >= 0);
  for (int r = 1; r < 4; ++r) CHECK(code[size_t(r)] == code[0]);
  for (const char* check : {"memory plan fits the device", "no NaN/Inf in loss or gradients", "loss falling",
                            "checkpoint save -> load round trip"})
    CHECK(log0.find(std::string("PASS  ") + check) != std::string::npos);
  CHECK(log0.find("tensors identical after save -> load") != std::string::npos);
  fs::remove_all(s.dir);
}
