// `trainer plan` (app/plan_command.h): the hardware table, the long
// pipeline simulation the search relies on, the worked 7B example against
// its golden output, and the messages for layouts that do not fit, GPUs the
// table does not know and a bad --world. The plan's bytes against real runs:
// tests/test_plan_traffic.cpp. The FLOP counts of sliding-window attention.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/config.h"
#include "e2e_util.h"
#include "model/flops.h"
#include "model/params.h"
#include "pipeline/long_simulation.h"
#include "pipeline/pipeline_plan.h"
#include "pipeline/stage_split.h"
#include "planner/hardware.h"
#include "observe/step_time.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

const std::string kSource = TRAINER_SOURCE_DIR;

// `trainer plan ARGS` from the source directory (so configs/ paths print as given).
int plan(const std::string& args, std::string* out) {
  return e2e::run("cd " + kSource + " && " + TRAINER_BIN + " plan " + args, out);
}

}  // namespace

TEST_CASE("hardware table: names, device lines, and the MFU peaks come from it", "[plan]") {
  REQUIRE(find_gpu("A100") == find_gpu("a100-80gb"));
  REQUIRE(find_gpu("h200") != nullptr);
  CHECK(find_gpu("h200")->memory_gib == 141);
  CHECK(find_gpu("tpu-v5") == nullptr);
  CHECK(gpu_of_device_line("NVIDIA A100-SXM4-40GB")->name == "a100-40gb");
  CHECK(gpu_of_device_line("NVIDIA L40S")->name == "l40s");
  CHECK(gpu_of_device_line("NVIDIA L4")->name == "l4");
  CHECK(gpu_of_device_line("cpu") == nullptr);
  // One table: the run's MFU peak is the plan's bf16 number (half for fp32 on TF32).
  for (const Hardware& h : known_gpus()) {
    INFO(h.name);
    CHECK(peak_tflops("NVIDIA " + h.name, true, 0) == h.bf16_tflops);
    CHECK(peak_tflops("NVIDIA " + h.name, false, 0) == h.bf16_tflops / 2);
  }
  CHECK(peak_tflops("NVIDIA H100 80GB HBM3", true, 123) == 123);

  Config c;
  c.hardware.gpu = "a100-80gb";
  c.hardware.network_gbit_s = 3.125;
  const Hardware a = resolve_hardware(c);
  CHECK(a.network_gbit_s == 3.125);
  CHECK(a.bf16_tflops == 312);
  CHECK(resolve_hardware(c, "h100").bf16_tflops == 989);
  c.hardware.gpu = "mi300x";
  try {
    resolve_hardware(c);
    FAIL("an unknown GPU without its numbers must be refused");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("known GPUs: h100, h200, a100-80gb") != std::string::npos);
    CHECK(msg.find("hardware.bf16_tflops") != std::string::npos);
  }
  c.hardware.memory_gib = 192;
  c.hardware.bf16_tflops = 1307;
  c.hardware.nvlink_gb_s = 896;
  c.hardware.network_gbit_s = 400;
  const Hardware custom = resolve_hardware(c);
  CHECK(custom.name == "mi300x");
  CHECK(custom.memory_gib == 192);
  CHECK(custom.matmul_efficiency == 0.5);
}

TEST_CASE("a long pipeline from two short simulations equals the full simulation", "[plan][pipeline]") {
  for (const char* kind : {"1f1b", "gpipe", "interleaved", "zb-h1"})
    for (int p : {2, 4}) {
      Config c;
      c.parallel.pp_schedule = kind;
      c.parallel.pp_virtual = 2;
      const int64_t m = 8 * long_simulation_cutoff(p, pipeline_chunks(c)) + 4 * p;
      std::vector<ActionCosts> costs(static_cast<size_t>(p));
      for (int r = 0; r < p; ++r) {  // unequal stages, as a real split has
        costs[size_t(r)].forward = 1 + 0.25 * r;
        costs[size_t(r)].backward = 2.1 + 0.5 * r;
        costs[size_t(r)].backward_input = costs[size_t(r)].backward_weight = costs[size_t(r)].backward / 2;
      }
      const Simulation full = simulate(schedule_for(c, p, m), costs, planned_transfer_mode(c));
      const Simulation fast = simulate_long(c, p, m, costs);
      REQUIRE(full.ok);
      REQUIRE(fast.ok);
      INFO(kind << " p " << p << " m " << m << ": step " << fast.step_time << " vs full " << full.step_time
                << " (relative tolerance 1e-9)");
      CHECK(std::abs(fast.step_time - full.step_time) <= 1e-9 * full.step_time);
      CHECK(std::abs(fast.bubble() - full.bubble()) <= 1e-9);
      CHECK(fast.peak_chunk_slots == full.peak_chunk_slots);
      CHECK(fast.peak_slots == full.peak_slots);
    }
}

TEST_CASE("trainer plan --search on configs/plan_7b.yaml matches tests/golden/plan_7b.txt", "[plan][cli]") {
  // TRAINER_UPDATE_GOLDEN=1 rewrites the golden file (after a deliberate change of the model).
  std::string out;
  const int rc = plan("--config configs/plan_7b.yaml --search", &out);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  const fs::path golden = fs::path(kSource) / "tests/golden/plan_7b.txt";
  if (std::getenv("TRAINER_UPDATE_GOLDEN")) std::ofstream(golden) << out;
  std::ifstream in(golden);
  REQUIRE(in.good());
  const std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (out != want) {
    const fs::path got = fs::temp_directory_path() / ("plan_7b_" + std::to_string(::getpid()) + ".txt");
    std::ofstream(got) << out;
    std::string diff;
    e2e::run("diff -u " + golden.string() + " " + got.string(), &diff);
    fs::remove(got);
    FAIL("trainer plan output differs from " << golden.string()
                                            << " (TRAINER_UPDATE_GOLDEN=1 regenerates it):\n" << diff);
  }
  // What the worked example is about.
  CHECK(out.find("search: ") != std::string::npos);
  CHECK(out.find("fits: ") != std::string::npos);
}

TEST_CASE("trainer plan: a layout that does not fit says by how much and which change fits", "[plan][cli]") {
  std::string out;
  // 32-way data parallelism without ZeRO keeps every weight, gradient and Adam moment on each GPU.
  const int rc = plan("--config configs/plan_7b.yaml --set parallel.tp=1 --set parallel.sp=false --set parallel.dp=32 "
                      "--set parallel.zero_stage=0 --set train.micro_batch_size=2",
                      &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("DOES NOT FIT: ") != std::string::npos);
  CHECK(out.find("DOES NOT FIT: 134.1 GiB of 80.0 GiB (167.6%), 54.1 GiB over the device; it fits with "
                 "parallel.zero_stage=1 (61.1 GiB)") != std::string::npos);
  CHECK(out.find("(within the 90% a plan may fill)") != std::string::npos);
  // Within the device but not the 90% a plan may fill (the smoke test's
  // limit too): tight, never "fits".
  out.clear();
  REQUIRE(plan("--config configs/plan_7b.yaml --set parallel.tp=1 --set parallel.sp=false --set parallel.dp=32 "
               "--set parallel.zero_stage=3 --set train.micro_batch_size=4",
               &out) == 0);
  CHECK(out.find("  TIGHT: 73.5 GiB of 80.0 GiB (91.9%), 1.5 GiB over the 90% a plan may fill (72.0 GiB") !=
        std::string::npos);
  CHECK(out.find("  fits: ") == std::string::npos);
  // A layout that fits says against which limit.
  out.clear();
  REQUIRE(plan("--config configs/plan_7b.yaml", &out) == 0);
  CHECK(out.find("  fits: 7.7 GiB of 80.0 GiB (9.6%), within the 90% a plan may fill (72.0 GiB") != std::string::npos);
  // 7B on one GPU: only ZeRO-Offload fits (the optimizer's 75 GiB go to the
  // host), and the plan says how much host memory that takes.
  out.clear();
  REQUIRE(plan("--config configs/plan_7b.yaml --world 1 --set parallel.tp=1 --set parallel.sp=false --set parallel.dp=1",
               &out) == 0);
  CHECK(out.find("DOES NOT FIT: 117.2 GiB of 80.0 GiB (146.5%), 37.2 GiB over the device; it fits with "
                 "optim.offload=optimizer (41.9 GiB; 113.0 GiB of host memory per rank)") != std::string::npos);
  // With it, the ledger counts the host bytes apart from the device's.
  out.clear();
  REQUIRE(plan("--config configs/plan_7b.yaml --world 1 --set parallel.tp=1 --set parallel.sp=false --set parallel.dp=1 "
               "--set optim.offload=optimizer",
               &out) == 0);
  CHECK(out.find(" 0 B  (AdamW m, v, master weights, F32); ZeRO-Offload: in host memory, 113.0 GiB "
                 "per rank with the fp32 masters and gradients, not in the total") != std::string::npos);
  CHECK(out.find("  fits: 41.9 GiB of 80.0 GiB") != std::string::npos);
  // No single change fits: name the other levers.
  out.clear();
  REQUIRE(plan("--config configs/plan_7b.yaml --world 1 --set parallel.tp=1 --set parallel.sp=false --set parallel.dp=1 "
               "--set train.seq_len=16384 --set model.max_seq_len=16384",
               &out) == 0);
  CHECK(out.find("DOES NOT FIT: ") != std::string::npos);
  CHECK(out.find("no single change of parallel.zero_stage, train.recompute, optim.offload or train.micro_batch_size "
                 "fits: raise parallel.tp or parallel.pp") != std::string::npos);
}

TEST_CASE("trainer plan --world: parallel.dp follows the world, --search chooses the layout itself", "[plan][cli]") {
  // The file's parallel.dp=4 is for 32 GPUs: on 64 the plan takes dp 8, and says so.
  std::string out;
  int rc = plan("--config configs/plan_7b.yaml --world 64 --gpu h100", &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("parallel.dp=4 makes 32 GPUs; for --world 64 the plan uses parallel.dp=8") != std::string::npos);
  CHECK(out.find("mesh: 64 ranks = pp 1 x dp 8 x cp 1 x tp 8") != std::string::npos);
  // tp 8 divides no 12 GPUs: only the search can answer, and it does.
  out.clear();
  rc = plan("--config configs/plan_7b.yaml --world 12 --search --top 3", &out);
  REQUIRE(rc == 0);
  CHECK(out.find("this configuration is no layout of 12 GPUs (") != std::string::npos);
  CHECK(out.find("the search chooses tp, pp, cp and dp itself") != std::string::npos);
  CHECK(out.find("search: ") != std::string::npos);
  CHECK(out.find("    1  tp ") != std::string::npos);
}

TEST_CASE("trainer plan: unknown GPUs list the known ones, a bad --world is refused (exit 2)", "[plan][cli]") {
  struct Case {
    std::string args, want;
  };
  for (const Case& k : std::vector<Case>{
           {"--gpu tpu-v5", "--gpu tpu-v5 is not a GPU the table knows; known GPUs: h100, h200, a100-80gb, a100-40gb"},
           {"--set hardware.gpu=mi300x", "hardware.gpu=mi300x is not a GPU the table knows; known GPUs:"},
           {"--world 0", "--world 0: the number of GPUs must be >= 1"},
           {"--world -4", "--world -4: the number of GPUs must be >= 1"},
           {"--world 12", "is 32 processes, this run has 12"},
           {"--world 32 --gpus-per-node 4", "parallel.tp"},
       }) {
    std::string out;
    const int rc = plan("--config configs/plan_7b.yaml " + k.args, &out);
    INFO(k.args << "\n" << out);
    CHECK(rc == 2);
    CHECK(out.find(k.want) != std::string::npos);
  }
}

TEST_CASE("FLOP estimates count a sliding window's band of attention, not the causal triangle", "[plan][window]") {
  // T = 1024 tokens, a window of 128: each query sees at most 129 keys. The
  // estimates use the continuous count of visible pairs per sequence and
  // head: T^2/2 causal, T^2/2 - (T - W)^2/2 with the window.
  const std::string model = "model: {arch: llama, d_model: 64, n_layers: 2, n_heads: 4, max_seq_len: 1024";
  const std::string rest = "}\ntrain: {seq_len: 1024}\ndata: {train: [x.bin]}\n";
  const Config full = load_config_text(model + rest, "<test>", {});
  const Config band = load_config_text(model + ", sliding_window: 128" + rest, "<test>", {});
  const ModelDims f = make_dims(full, 2, 1024), w = make_dims(band, 2, 1024);
  REQUIRE(w.window == 128);
  const double T = 1024, W = 128, causal_pairs = T * T / 2, band_pairs = T * T / 2 - (T - W) * (T - W) / 2;
  CHECK(f.attended_pairs(1024) == causal_pairs);
  CHECK(w.attended_pairs(1024) == band_pairs);
  CHECK(w.attended_pairs(100) == 100.0 * 100 / 2);  // the window covers a short sequence
  // A layer's forward FLOPs: only the attention core (2 matmuls of 2 D per visible pair) differs.
  const double core = 4.0 * double(f.B) * double(f.Hq) * double(f.D);
  const double saved = layer_flops(f, 0) - layer_flops(w, 0);
  std::printf("[window]    layer forward FLOPs at T=1024: %.4g causal, %.4g with a window of 128 (attention core "
              "%.4g -> %.4g)\n",
              layer_flops(f, 0), layer_flops(w, 0), core * causal_pairs, core * band_pairs);
  CHECK(std::fabs(saved - core * (causal_pairs - band_pairs)) <= 1e-9 * layer_flops(f, 0));
  // MFU's model FLOPs per token (model/flops.h): 12 L C per attended pair
  // per token, T / 2 pairs a token causally, the band's pairs / T with a window.
  const double per_pair = 12.0 * double(f.L) * double(f.C);
  const double fpt = flops_per_token(f), wpt = flops_per_token(w);
  CHECK(std::fabs((fpt - wpt) - per_pair * (causal_pairs - band_pairs) / T) <= 1e-9 * fpt);
}
