// The pieces around the model: LR schedule, gradient clipping, token files
// and the batch sampler, the memory plan against the real allocation, and an
// end-to-end run of the binary whose loss must fall.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/transformer.h"
#include "optim/zero.h"
#include "comm/process_group.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "data/batch_sampler.h"
#include "config/config.h"
#include "planner/memory_plan.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("trainer_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_tokens(const fs::path& p, const std::vector<uint16_t>& toks) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
}

int run_command(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace

TEST_CASE("learning-rate schedule: warmup, cosine, linear, constant", "[loop]") {
  LrSchedule s{"cosine", 1.0, 0.1, 10, 110};
  CHECK(learning_rate(s, 0) == Approx(0.1));
  CHECK(learning_rate(s, 9) == Approx(1.0));
  CHECK(learning_rate(s, 10) == Approx(1.0));
  CHECK(learning_rate(s, 60) == Approx(0.55));     // half way: min + (max-min)/2
  CHECK(learning_rate(s, 110) == Approx(0.1));
  CHECK(learning_rate(s, 500) == Approx(0.1));     // stays at min_lr after decay
  s.kind = "linear";
  CHECK(learning_rate(s, 35) == Approx(1.0 - 0.9 * 0.25));
  s.kind = "constant";
  CHECK(learning_rate(s, 100) == Approx(1.0));
}

TEST_CASE("clip factor follows torch clip_grad_norm_", "[loop]") {
  CHECK(clip_factor(0.5, 1.0) == 1.0);
  CHECK(clip_factor(4.0, 1.0) == Approx(1.0 / (4.0 + 1e-6)));
  CHECK(clip_factor(4.0, 0.0) == 1.0);  // clipping off
}

TEST_CASE("the global gradient norm sums every element once, padding never", "[loop][zero]") {
  const Config c = load_config_text("model: {arch: gpt2, d_model: 32, n_layers: 2, n_heads: 4}\n"
                                    "data: {train: [x.bin]}\n", "<test>", {});
  for (int stage : {0, 1}) {
    Model m;
    build_model(m, make_dims(c, 1, 16), 0.02, Device::CPU, zero_model_storage(stage));
    SingleRankCommunicator solo("dp", 0, Device::CPU);
    ZeroOptimizer zero(m, stage, solo, solo, {});
    zero.begin_step();
    // 2 in every gradient element and NaN in the arena's padding, which no
    // piece may touch.
    ops::fill(m.grad_arena.flat_f32(), std::nanf(""));
    for (const Tensor& g : m.grad_tensors) ops::fill(g, 2.f);
    INFO("stage " << stage);
    CHECK(zero.grad_sum_squares() == Approx(4.0 * double(parameter_count(m.params))));
  }
}

TEST_CASE("batch sampler is a pure function of (seed, step, index)", "[loop][data]") {
  const fs::path dir = temp_dir("sampler");
  std::vector<uint16_t> toks(5000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t(i % 200);
  write_tokens(dir / "a.bin", toks);
  BatchSampler s1({(dir / "a.bin").string()}, "uint16", 32, 256, 7, "train");
  BatchSampler s2({(dir / "a.bin").string()}, "uint16", 32, 256, 7, "train");
  BatchSampler s3({(dir / "a.bin").string()}, "uint16", 32, 256, 8, "train");
  std::vector<int32_t> in1(32), tg1(32), in2(32), tg2(32), in3(32), tg3(32);
  s1.sequence(5, 3, in1.data(), tg1.data());
  s2.sequence(5, 3, in2.data(), tg2.data());
  s3.sequence(5, 3, in3.data(), tg3.data());
  CHECK(in1 == in2);
  CHECK(tg1 == tg2);
  CHECK(in1 != in3);  // another seed draws another window
  // Targets are the inputs shifted by one token.
  for (int t = 0; t + 1 < 32; ++t) CHECK(tg1[t] == in1[t + 1]);
  fs::remove_all(dir);
}

TEST_CASE("token-file errors name the file", "[loop][data]") {
  const fs::path dir = temp_dir("tokerr");
  {
    std::ofstream f(dir / "odd.bin", std::ios::binary);
    f << "abc";  // 3 bytes: not a whole number of uint16 tokens
  }
  write_tokens(dir / "small.bin", std::vector<uint16_t>(10, 1));
  write_tokens(dir / "big_ids.bin", std::vector<uint16_t>(100, 300));
  auto msg = [](auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string odd = (dir / "odd.bin").string();
  CHECK_THAT(msg([&] { BatchSampler({odd}, "uint16", 8, 256, 1, "train"); }),
             Catch::Contains(odd) && Catch::Contains("not a multiple"));
  const std::string small = (dir / "small.bin").string();
  CHECK_THAT(msg([&] { BatchSampler({small}, "uint16", 32, 256, 1, "train"); }),
             Catch::Contains(small) && Catch::Contains("fewer than one sequence"));
  const std::string missing = (dir / "missing.bin").string();
  CHECK_THAT(msg([&] { BatchSampler({missing}, "uint16", 8, 256, 1, "train"); }),
             Catch::Contains(missing));
  const std::string big = (dir / "big_ids.bin").string();
  CHECK_THAT(msg([&] { BatchSampler({big}, "uint16", 8, 256, 1, "train"); }),
             Catch::Contains(big) && Catch::Contains("300") && Catch::Contains("vocab_size"));
  fs::remove_all(dir);
}

TEST_CASE("memory plan equals what the arenas allocate", "[loop][plan]") {
  for (const char* arch : {"llama", "gpt2"}) {
    for (int experts : {0, 4}) {
      for (int stage : {0, 1, 2, 3}) {
        Config c = load_config_text(std::string("model: {arch: ") + arch +
                                        ", d_model: 32, n_layers: 2, n_heads: 4, moe: {num_experts: " +
                                        std::to_string(experts) + "}}\ndata: {train: [x.bin]}\n",
                                    "<test>", {});
        const MemoryPlan p = plan_memory(c, DType::F32, 1, stage);
        Model m;
        build_model(m, make_dims(c, c.train.micro_batch_size, c.train.seq_len), c.model.init_std, Device::CPU,
                    zero_model_storage(stage));
        SingleRankCommunicator solo("dp", 0, Device::CPU);
        ZeroOptimizer opt(m, stage, solo, solo, {});
        INFO(arch << " experts=" << experts << " stage=" << stage);
        if (stage < 3) {
          CHECK(p.param_bytes == m.param_arena.capacity());
          CHECK(p.param_bytes == m.param_arena.used());
        }
        if (stage < 2) CHECK(p.grad_bytes == m.grad_arena.used());
        CHECK(p.optimizer_bytes == opt.optimizer_bytes());
        CHECK(p.activation_bytes == m.slots[0]->arena.used());
        CHECK(p.workspace_bytes == m.scratch_arena.used());
        CHECK(p.parameters == parameter_count(m.params));
      }
    }
  }
}

TEST_CASE("the trainer binary trains tiny models and the loss falls", "[loop][e2e]") {
  const fs::path dir = temp_dir("e2e");
  // Real English text: the licenses every Debian system ships, one byte a token.
  std::vector<uint16_t> toks;
  for (const char* f : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"}) {
    std::ifstream in(f, std::ios::binary);
    REQUIRE(in.good());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (unsigned char ch : text) toks.push_back(ch);
  }
  write_tokens(dir / "train.bin", toks);
  for (const char* arch : {"llama", "gpt2", "llama-moe"}) {
    const std::string moe = std::string(arch) == "llama-moe" ? ", moe: {num_experts: 4, top_k: 2}" : "";
    const std::string a = std::string(arch) == "gpt2" ? "gpt2" : "llama";
    const fs::path run = dir / arch;
    std::ofstream(dir / "cfg.yaml") << "run: {name: e2e, dir: " << run.string() << "}\n"
                                    << "model: {arch: " << a << ", d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32" << moe << "}\n"
                                    << "train: {steps: 60, seq_len: 32, micro_batch_size: 8, global_batch_size: 16}\n"
                                    << "optim: {lr: 3.0e-3, warmup_steps: 10}\n"
                                    << "data: {train: [" << (dir / "train.bin").string() << "], valid: ["
                                    << (dir / "train.bin").string() << "]}\n"
                                    << "log: {interval: 1}\n";
    std::string out;
    const int rc = run_command(std::string(TRAINER_BIN) + " --config " + (dir / "cfg.yaml").string(), &out);
    INFO(out);
    REQUIRE(rc == 0);
    std::ifstream js(run / "metrics.jsonl");
    std::vector<double> losses;
    std::string line;
    while (std::getline(js, line)) {
      auto k = line.find("\"loss\": ");
      if (k != std::string::npos) losses.push_back(std::stod(line.substr(k + 8)));
    }
    REQUIRE(losses.size() == 60);
    std::printf("[e2e] %s: loss %.3f -> %.3f over 60 steps\n", arch, losses.front(), losses.back());
    // Uniform guessing over 256 bytes is ln 256 = 5.55; English bytes drop well below.
    CHECK(losses.front() > 5.0);
    CHECK(losses.back() < losses.front() - 1.0);
    CHECK_THAT(out, Catch::Contains("memory plan per rank") && Catch::Contains("val loss"));
  }
  fs::remove_all(dir);
}
