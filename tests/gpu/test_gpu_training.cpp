// Whole-model check on the GPU: the same tiny model, data and seed trained 50
// steps (4 on the emulated device) on the CPU (fp32 reference) and on the GPU
// in fp32, bf16 and fp16; the loss curves must agree within each precision's
// tolerance (per step at first, then over windows: curve_diff says why). And a sharded rank's initial weights on the device equal the
// host's slice bit for bit.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "config/config.h"
#include "core/device_memory.h"
#include "model/sharding.h"
#include "model/transformer.h"
#include "optim/zero.h"
#include "tests/gpu/gpu_test_util.h"
#include "train/engine.h"

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

// The run's length and batch. On a GPU 50 steps of 8 sequences (two
// micro-batches of 4). The emulated device takes about a second a step:
// there 4 steps of 4 sequences, still two micro-batches, a warmup and the
// decay after it, a loss that falls by more than 1.
struct Schedule {
  int steps, warmup, micro_batch, global_batch;
};
Schedule schedule() { return gputest::gpu_or_emu(Schedule{50, 5, 4, 8}, Schedule{4, 2, 2, 4}); }

// launched: as if started by torchrun with one process, so the engine builds
// process groups (an NCCL communicator of one on the GPU) and ZeRO runs its
// collectives through them.
TrainSummary train(const std::string& arch, const std::string& device,
                          const std::string& precision, int experts, int zero_stage = 0, bool launched = false) {
  const Schedule sc = schedule();
  const std::string yaml =
      "run: {name: gpu_train, dir: " +
      (fs::temp_directory_path() / ("gpu_run_" + std::to_string(::getpid()))).string() +
      "}\nmodel: {arch: " + arch +
      ", d_model: 128, n_layers: 2, n_heads: 2, max_seq_len: 64, moe: {num_experts: " +
      std::to_string(experts) + ", top_k: 2}}\n" + "train: {device: " + device +
      ", precision: " + precision + ", steps: " + std::to_string(sc.steps) +
      ", seq_len: 64, micro_batch_size: " + std::to_string(sc.micro_batch) +
      ", global_batch_size: " + std::to_string(sc.global_batch) + "}\noptim: {lr: 3.0e-3, warmup_steps: " +
      std::to_string(sc.warmup) + "}\nparallel: {zero_stage: " + std::to_string(zero_stage) + "}\n"
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
  return run_training(c, opt);
}

// The GPU's loss at each step it applied, against the CPU's loss at the same
// step: an fp16 overflow skips a step (the loss scale halves), which is
// counted and printed, not a failure, as long as a few at most are skipped.
//
// Two measures, both held to the precision's tolerance. Per step over the
// first kEarlySteps, while both runs hold nearly the same weights. After
// that a 16-bit run's weights drift from fp32's, and a hard batch amplifies
// the drift at one step: measured on the emulated device at the GPU's 50
// steps, bf16 followed fp32 within 4e-3 everywhere but step 45 (6.3e-2, a
// batch where the fp32 gradient norm also spikes 4x), yet from fp32's own
// step-44 weights the bf16 step 45 was within 2e-4. So later steps are
// compared as the mean over windows of kWindow steps (1.4e-2 there).
constexpr size_t kEarlySteps = 10, kWindow = 5;
struct CurveDiff {
  double worst = 0;  // the larger of the two measures
  double worst_early = 0, worst_window = 0;
  size_t compared = 0, skipped = 0;
  bool finite = true;
};
CurveDiff curve_diff(const TrainSummary& gpu, const std::vector<double>& cpu) {
  CurveDiff d;
  d.skipped = gpu.skipped_steps.size();
  std::vector<std::pair<double, double>> pairs;  // (gpu, cpu) at each step both applied
  size_t k = 0;
  for (int64_t step = 1; step <= int64_t(cpu.size()) && k < gpu.losses.size(); ++step) {
    if (std::find(gpu.skipped_steps.begin(), gpu.skipped_steps.end(), step) != gpu.skipped_steps.end()) continue;
    const double g = gpu.losses[k++], c = cpu[size_t(step - 1)];
    if (!std::isfinite(g)) d.finite = false;
    if (size_t(step) <= kEarlySteps) d.worst_early = std::max(d.worst_early, std::fabs(g - c) / c);
    pairs.emplace_back(g, c);
    ++d.compared;
  }
  const size_t w = std::min(kWindow, pairs.size());
  for (size_t i = 0; w > 0 && i + w <= pairs.size(); ++i) {
    double g = 0, c = 0;
    for (size_t j = i; j < i + w; ++j) g += pairs[j].first, c += pairs[j].second;
    d.worst_window = std::max(d.worst_window, std::fabs(g - c) / c);
  }
  d.worst = std::max(d.worst_early, d.worst_window);
  return d;
}

}  // namespace

TEST_CASE("a tiny model trains to the same loss curve on GPU and CPU", "[gpu][training]") {
  // head_dim 64 (d_model 128, 2 heads): a size the flash-attention kernels support.
  struct Case {
    const char* arch;
    int experts;
    const char* precision;
    double tol;  // max |gpu - cpu| / cpu over the steps
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
      const std::vector<double> cpu = train(c.arch, "cpu", "fp32", c.experts).losses;
      const TrainSummary gpu = train(c.arch, "cuda", c.precision, c.experts);
      const size_t steps = size_t(schedule().steps);
      REQUIRE(cpu.size() == steps);
      const CurveDiff d = curve_diff(gpu, cpu);
      std::printf(
          "[gpu training] %s experts=%d %s: loss %.4f -> %.4f (cpu %.4f -> %.4f), %zu steps compared, %zu "
          "skipped (fp16 overflow), max rel diff %.3e per step to step %zu, %.3e over %zu-step windows (tol %.0e)\n",
          c.arch, c.experts, c.precision, gpu.losses.empty() ? 0.0 : gpu.losses.front(),
          gpu.losses.empty() ? 0.0 : gpu.losses.back(), cpu.front(), cpu.back(), d.compared, d.skipped,
          d.worst_early, kEarlySteps, d.worst_window, kWindow, c.tol);
      REQUIRE(gpu.losses.size() + d.skipped == steps);
      CHECK(d.skipped <= 5);
      CHECK(d.finite);
      CHECK(d.worst < c.tol);
      CHECK(gpu.losses.back() < gpu.losses.front() - 1.0);  // it learned
    }
  }
}

TEST_CASE("one GPU under a launcher: NCCL world of one, ZeRO 0-3, same curve as the CPU", "[gpu][training][nccl]") {
  const std::vector<double> cpu = train("llama", "cpu", "fp32", 0).losses;
  const size_t steps = size_t(schedule().steps);
  REQUIRE(cpu.size() == steps);
  for (int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("zero " << stage) {
      const TrainSummary gpu = train("llama", "cuda", "bf16", 0, stage, true);
      REQUIRE(gpu.losses.size() == steps);
      const CurveDiff d = curve_diff(gpu, cpu);
      std::printf("[gpu training] NCCL world of 1, ZeRO %d, bf16: loss %.4f -> %.4f, max rel diff vs cpu %.3e per step "
                  "to step %zu, %.3e over %zu-step windows (tol 5e-2)\n",
                  stage, gpu.losses.front(), gpu.losses.back(), d.worst_early, kEarlySteps, d.worst_window, kWindow);
      CHECK(d.finite);
      CHECK(d.worst < 5e-2);
    }
  }
}


TEST_CASE("a sharded rank's initial weights on the GPU are the one-process tensor's slice, bit for bit",
          "[gpu][training]") {
  // Rank (tp 1, pp 1) of tp 2 x pp 2: a column/row/vocabulary slice of the
  // last stage, with the padded rows of a 61-id vocabulary and the tied copy.
  const Config c = load_config_text(
      "model: {arch: gpt2, vocab_size: 61, d_model: 64, n_layers: 2, n_heads: 4, tie_embeddings: true}\n"
      "data: {train: [x.bin]}\n",
      "<gpu test>", {});
  for (DType storage : {DType::F32, DType::BF16}) {
    MeshShape mesh;
    mesh.tp = 2;
    mesh.pp = 2;
    Coords at;
    at.tp = 1;
    at.pp = 1;
    const ShardingPlan plan = make_sharding_plan(make_dims(c, 1, 16, storage), 0.02, mesh, at, 0);
    Model m;
    build_model(m, plan, Device::CUDA, zero_model_storage(0));
    SingleRankCommunicator solo("dp", 0, Device::CUDA);
    ZeroOptimizer zero(m, 0, solo, solo, {});
    zero.load([&](const std::string&, int p, int64_t b, int64_t n, float* dst) {
      initial_values(m.params[size_t(p)], 1234, b, n, dst);
    }, false);
    int64_t differ = 0, checked = 0;
    for (const ZeroPiece& z : zero.own_pieces()) {
      std::vector<float> got(size_t(z.count)), want(size_t(z.count));
      read_to_host(zero.fp32_weight(z), got.data());
      initial_values(m.params[size_t(z.param)], 1234, z.begin, z.count, want.data());
      differ += std::memcmp(got.data(), want.data(), got.size() * 4) != 0;
      checked += z.count;
    }
    std::printf("[gpu] %s: %lld initial elements of a tp 2 x pp 2 rank checked against the host values, %lld pieces "
                "differ\n",
                dtype_name(storage), (long long)checked, (long long)differ);
    CHECK(checked > 0);
    CHECK(differ == 0);
  }
}
