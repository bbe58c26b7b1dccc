// Whole-model check on the GPU: the same tiny model, data and seed trained 50
// steps on the CPU (fp32 reference) and on the GPU in fp32, bf16 and fp16; the
// loss curves must agree within each precision's tolerance.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/engine.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

std::string token_file() {
  static std::string path;
  if (!path.empty()) return path;
  const fs::path dir = fs::temp_directory_path() / ("gpu_train_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  // Real text keeps the loss curve meaningful: the GPL, one byte a token.
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (text.size() < 10000) text.assign(20000, 'a');  // machines without the file
  std::vector<uint16_t> toks(text.begin(), text.end());
  path = (dir / "tokens.bin").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  return path;
}

// launched: as if started by torchrun with one process, so the engine builds
// process groups (an NCCL communicator of one on the GPU) and ZeRO runs its
// collectives through them.
std::vector<double> train(const std::string& arch, const std::string& device,
                          const std::string& precision, int experts, int zero_stage = 0, bool launched = false) {
  const std::string yaml =
      "run: {name: gpu_train, dir: " +
      (fs::temp_directory_path() / ("gpu_run_" + std::to_string(::getpid()))).string() +
      "}\nmodel: {arch: " + arch +
      ", d_model: 128, n_layers: 2, n_heads: 2, max_seq_len: 64, moe: {num_experts: " +
      std::to_string(experts) + ", top_k: 2}}\n" + "train: {device: " + device +
      ", precision: " + precision +
      ", steps: 50, seq_len: 64, micro_batch_size: 4, global_batch_size: 8}\n"
      "optim: {lr: 3.0e-3, warmup_steps: 5}\nparallel: {zero_stage: " + std::to_string(zero_stage) + "}\n"
      "data: {train: [" +
      token_file() + "]}\nlog: {interval: 50, jsonl: false, progress: lines}\n";
  Config c = load_config_text(yaml, "<gpu test>", {});
  RunOptions opt;
  opt.quiet = true;
  if (launched) {
    opt.launch.launcher = "torchrun";
    opt.launch.master_addr = "127.0.0.1";
    opt.launch.master_port = 0;  // rank 0's store picks a free port
  }
  return run_training(c, opt).losses;
}

}  // namespace

TEST_CASE("a tiny model trains to the same loss curve on GPU and CPU", "[gpu][training]") {
  // head_dim 64 (d_model 128, 2 heads): a size the flash-attention kernels support.
  struct Case {
    const char* arch;
    int experts;
    const char* precision;
    double tol;  // max |gpu - cpu| / cpu over the 50 steps
  };
  // fp32 differs only by summation order; bf16 keeps 8 mantissa bits, fp16 10
  // (and loss scaling), so their curves drift by a few percent at most.
  const Case cases[] = {{"llama", 0, "fp32", 2e-3},
                        {"llama", 0, "bf16", 5e-2},
                        {"llama", 0, "fp16", 3e-2},
                        {"gpt2", 0, "bf16", 5e-2},
                        {"llama", 4, "bf16", 8e-2}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.arch << " experts=" << c.experts << " " << c.precision) {
      const std::vector<double> cpu = train(c.arch, "cpu", "fp32", c.experts);
      const std::vector<double> gpu = train(c.arch, "cuda", c.precision, c.experts);
      REQUIRE(cpu.size() == 50);
      REQUIRE(gpu.size() == 50);
      double worst = 0;
      for (size_t i = 0; i < cpu.size(); ++i) {
        REQUIRE(std::isfinite(gpu[i]));
        worst = std::max(worst, std::fabs(gpu[i] - cpu[i]) / cpu[i]);
      }
      std::printf(
          "[gpu training] %s experts=%d %s: loss %.4f -> %.4f (cpu %.4f -> %.4f), max rel diff "
          "%.3e (tol %.0e)\n",
          c.arch, c.experts, c.precision, gpu.front(), gpu.back(), cpu.front(), cpu.back(), worst,
          c.tol);
      CHECK(worst < c.tol);
      CHECK(gpu.back() < gpu.front() - 1.0);  // it learned
    }
  }
}

TEST_CASE("one GPU under a launcher: NCCL world of one, ZeRO 0-3, same curve as the CPU", "[gpu][training][nccl]") {
  const std::vector<double> cpu = train("llama", "cpu", "fp32", 0);
  REQUIRE(cpu.size() == 50);
  for (int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("zero " << stage) {
      const std::vector<double> gpu = train("llama", "cuda", "bf16", 0, stage, true);
      REQUIRE(gpu.size() == 50);
      double worst = 0;
      for (size_t i = 0; i < cpu.size(); ++i) {
        REQUIRE(std::isfinite(gpu[i]));
        worst = std::max(worst, std::fabs(gpu[i] - cpu[i]) / cpu[i]);
      }
      std::printf("[gpu training] NCCL world of 1, ZeRO %d, bf16: loss %.4f -> %.4f, max rel diff vs cpu %.3e (tol 5e-2)\n",
                  stage, gpu.front(), gpu.back(), worst);
      CHECK(worst < 5e-2);
    }
  }
}
