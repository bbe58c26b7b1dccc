// The whole trainer on the emulated CUDA device (libtrainer_cuda_emu.so:
// the CUDA module's own kernels and host code compiled by g++ for emu/),
// against the CPU backend on the same configuration: fp32 losses equal, bf16
// and fp16 within their precision, fp16's overflow skipped and the scale
// halved, checkpoints crossing between the backends, dp2 and tp2 through
// the host-staged backend (fp32, and dp2 in bf16 with ZeRO-Offload), the
// smoke test's verdict. Every ctest entry is
// one TEST_CASE, each with its own directory and CPU reference, so they run
// side by side; the smoke test times steps and is [serial].
//
// Tagged [emu_module]: a CPU-only build has no CUDA module to route ops to,
// so tests/CMakeLists.txt leaves these out there and reports one skipped
// test; a CUDA build without the emulated module (TRAINER_CUDA_EMU=OFF) fails
// them, saying so.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;
using e2e::run;
using e2e::Setup;

namespace {

// Head dimension 64 (of the CUDA attention's 32, 64 and 128) on the smallest
// widths that still split: two heads for tp 2.
const char* const kLlama =
    "{arch: llama, d_model: 128, n_layers: 2, n_heads: 2, n_kv_heads: 2, d_ff: 256, max_seq_len: 32}";
// Grouped-query attention (two query heads share a key/value head) at head
// dimension 32, the quickstart's attention (configs/quickstart.yaml).
const char* const kMoe =
    "{arch: llama, d_model: 128, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 256, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 128}}";

const char* const kEmuFp32 = " --set train.device=cuda --set train.precision=fp32";
const char* const kDeviceLine = "Emulated CUDA device";
// bf16 keeps 8 significant bits (2^-9 = 2e-3 per rounding); over 20 steps of
// this model the losses drift 2e-4 from fp32's. fp16 keeps 11 bits: 5e-5.
constexpr double kBf16Tol = 2e-3;
constexpr double kFp16Tol = 5e-4;

// The emulated module of this build; a test without it fails, naming why.
std::string emu_module() {
  const std::string m = TRAINER_CUDA_EMU_MODULE;
  INFO("this build has no emulated CUDA module (configured with TRAINER_CUDA_EMU=OFF): reconfigure with "
       "-DTRAINER_CUDA_EMU=ON to build libtrainer_cuda_emu.so");
  REQUIRE(!m.empty());
  INFO(m << " is missing: build the trainer_cuda_emu target");
  REQUIRE(fs::exists(m));
  return m;
}

// Points TRAINER_CUDA_MODULE at the emulated module while it lives: the
// trainer processes (and run_by_hand's ranks) inherit it. The old value
// (catch_main.cpp's real module) comes back, for the tests after this one.
class EmulatedDevice {
 public:
  EmulatedDevice() {
    const std::string m = emu_module();
    if (const char* old = std::getenv(kVar)) old_ = old, had_ = true;
    ::setenv(kVar, m.c_str(), 1);
  }
  ~EmulatedDevice() { had_ ? ::setenv(kVar, old_.c_str(), 1) : ::unsetenv(kVar); }
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;

 private:
  static constexpr const char* kVar = "TRAINER_CUDA_MODULE";
  std::string old_;
  bool had_ = false;
};

// One trainer process; its output goes to *out, the test fails on an exit
// other than 0 showing the output's tail.
void train(const Setup& s, const std::string& run_dir, const std::string& args, std::string* out,
           const std::string& env = "") {
  const int rc = run(env + " " + TRAINER_BIN + " --config " + s.cfg + " --set run.dir=" + run_dir + " " + args, out);
  INFO(e2e::tail(*out));
  REQUIRE(rc == 0);
}

std::string at(const Setup& s, const std::string& name) { return (s.dir / name).string(); }

// e2e::make_setup's 20-step run (evaluated at 10 and 20, saved at 20) with
// half its batch, 4 sequences of 32 tokens a step in micro-batches of 2, for
// the emulator's pace; fp32 on the CPU unless a run's --set says otherwise.
// single() is that run, the reference.
Setup make_bench(const std::string& name, const std::string& model) {
  const Setup s = e2e::make_setup_config("emu", name, model,
                                         "device: cpu, precision: fp32, steps: 20, seq_len: 32, micro_batch_size: 2, "
                                         "global_batch_size: 4, eval_interval: 10, eval_steps: 1");
  std::string out;
  train(s, s.single(), "", &out);
  return s;
}

std::vector<double> losses_of(const std::string& run_dir) { return e2e::losses(fs::path(run_dir) / "metrics.jsonl"); }

// The run took the emulated device, not the CPU: a silent fallback would
// compare the CPU with itself.
void expect_emulated(const std::string& out) {
  INFO(e2e::tail(out));
  CHECK(out.find(kDeviceLine) != std::string::npos);
}

// One run on the emulated device at `precision` into the run directory
// `name`, checked to have taken it; returns its output.
std::string train_emulated(const Setup& s, const std::string& name, const std::string& precision,
                           const std::string& args = "") {
  std::string out;
  train(s, at(s, name), "--set train.device=cuda --set train.precision=" + precision + " " + args, &out);
  expect_emulated(out);
  return out;
}

// The loss falls: the last five steps' mean well below the first step's.
void expect_falling(const std::vector<double>& l, const std::string& label) {
  REQUIRE(l.size() >= 10);
  double last = 0;
  for (size_t i = l.size() - 5; i < l.size(); ++i) last += l[i] / 5;
  std::printf("[emu] %s: loss %.4f at the first logged step -> %.4f (mean of the last 5; must be < 0.8x)\n",
              label.c_str(), l.front(), last);
  CHECK(last < 0.8 * l.front());
}

// The run's losses within `tol` of the CPU fp32 run's at every step, and
// falling; returns them.
std::vector<double> expect_near_cpu(const Setup& s, const std::string& run_dir, const std::string& label, double tol) {
  const auto cpu = losses_of(s.single()), got = losses_of(run_dir);
  REQUIRE(got.size() == 20);
  const double worst = e2e::max_rel_diff(got, cpu);
  std::printf("[emu] %s vs fp32 cpu, 20 steps: losses max rel diff %.2e (tol %.0e)\n", label.c_str(), worst, tol);
  CHECK(worst < tol);
  expect_falling(got, label);
  return got;
}

// fp32 on the emulated device equals the CPU run: losses, validation and
// auxiliary losses 1e-5 at every step, final weights 1e-4
// (e2e::expect_same_run).
void check_fp32(const std::string& name, const std::string& model) {
  const EmulatedDevice device;
  const Setup b = make_bench(name, model);
  train_emulated(b, "emu", "fp32");
  e2e::expect_same_run(b.single(), "emu", name + " fp32 emulated vs cpu, 20 steps", at(b, "emu"));
  fs::remove_all(b.dir);
}

}  // namespace

TEST_CASE("emulated CUDA device: tiny llama in fp32 equals the CPU backend at every step",
          "[emu][e2e][emu_module]") {
  check_fp32("llama", kLlama);
}

TEST_CASE("emulated CUDA device: tiny MoE (4 experts, top-2, GQA, head dim 32) in fp32 equals the CPU backend at every step",
          "[emu][e2e][emu_module]") {
  check_fp32("moe", kMoe);
}

TEST_CASE("emulated CUDA device: bf16 mixed precision follows CPU fp32, and its checkpoint resumes on the CPU",
          "[emu][e2e][emu_module]") {
  const EmulatedDevice device;
  const Setup b = make_bench("bf16", kLlama);
  const std::string out = train_emulated(b, "bf16", "bf16", "--set checkpoint.interval=10");
  CHECK(out.find("storage BF16") != std::string::npos);
  const auto bf16 = expect_near_cpu(b, at(b, "bf16"), "bf16 emulated", kBf16Tol), cpu = losses_of(b.single());
  // Its checkpoint holds the fp32 master weights and moments (docs/ARCHITECTURE.md,
  // precision): the CPU takes steps 11-20 from it within bf16's distance of both curves.
  std::string resumed;
  train(b, at(b, "cpu_from_bf16"), "--set checkpoint.resume=" + at(b, "bf16") + "/ckpt/step_00000010", &resumed);
  CHECK(resumed.find("resumed from") != std::string::npos);
  const auto tail = losses_of(at(b, "cpu_from_bf16"));
  REQUIRE(tail.size() == 10);
  const std::vector<double> bf16_tail(bf16.begin() + 10, bf16.end()), cpu_tail(cpu.begin() + 10, cpu.end());
  const double vs_bf16 = e2e::max_rel_diff(tail, bf16_tail), vs_cpu = e2e::max_rel_diff(tail, cpu_tail);
  std::printf("[emu] bf16 emulated step 10 -> cpu fp32 steps 11-20: vs the bf16 run %.2e, vs the cpu run %.2e "
              "(tol %.0e)\n",
              vs_bf16, vs_cpu, kBf16Tol);
  CHECK(vs_bf16 < kBf16Tol);
  CHECK(vs_cpu < kBf16Tol);
  fs::remove_all(b.dir);
}

namespace {

struct Overflow {
  int64_t step;
  double scale, next;
};

// The run's "step N: gradient overflow at loss scale X, step skipped, loss
// scale -> Y" lines (train/step.cpp).
std::vector<Overflow> overflows(const std::string& out) {
  static const std::regex line(R"(step (\d+): gradient overflow at loss scale (\S+), step skipped, loss scale -> (\S+))");
  std::vector<Overflow> found;
  for (std::sregex_iterator m(out.begin(), out.end(), line), end; m != end; ++m)
    found.push_back({std::stoll((*m)[1]), std::stod((*m)[2]), std::stod((*m)[3])});
  return found;
}

// Each overflow halves the scale the step before it left; every logged step
// carries the scale of the overflows before it (no doubling: the window is
// 1000 steps).
void expect_halvings(const std::vector<Overflow>& skips, const std::vector<double>& logged_scales, double initial) {
  double scale = initial;
  for (const Overflow& o : skips) {
    CHECK(o.scale == scale);
    CHECK(o.next == scale / 2);
    scale /= 2;
  }
  REQUIRE(!logged_scales.empty());
  CHECK(logged_scales.back() == scale);
  for (double s : logged_scales) CHECK(s >= scale);
}

}  // namespace

TEST_CASE("emulated CUDA device: fp16 dynamic loss scaling skips the overflowing steps and halves the scale",
          "[emu][e2e][emu_module]") {
  const EmulatedDevice device;
  const Setup b = make_bench("fp16", kLlama);
  // 2^19: this model's first gradients overflow fp16 above 2^18 (its
  // norm-weight gradients, sums over every token, reach ~0.25), so step 1
  // is skipped; the same holds at 2^18 once training has grown them (step 3).
  const int64_t initial = int64_t(1) << 19;
  const std::string out =
      train_emulated(b, "fp16", "fp16", "--set train.initial_loss_scale=" + std::to_string(initial));
  const std::vector<Overflow> skips = overflows(out);
  REQUIRE(!skips.empty());
  CHECK(skips.front().step == 1);
  const auto fp16 = losses_of(at(b, "fp16"));
  REQUIRE(fp16.size() == 20 - skips.size());
  expect_halvings(skips, e2e::metric(fs::path(at(b, "fp16")) / "metrics.jsonl", "loss_scale"), double(initial));
  // The reference skips the same steps on the CPU (the test hook flags
  // them): the same batches, learning rates and updates.
  std::string hooks = "TRAINER_TEST_HOOKS=";
  for (const Overflow& o : skips) hooks += (&o == &skips.front() ? "skip=*:" : ",skip=*:") + std::to_string(o.step);
  std::string cpu_out;
  train(b, at(b, "cpu_skipping"), "", &cpu_out, hooks);
  const auto cpu = losses_of(at(b, "cpu_skipping"));
  const double worst = e2e::max_rel_diff(fp16, cpu);
  std::printf("[emu] fp16 emulated from loss scale %lld: steps", (long long)initial);
  for (const Overflow& o : skips) std::printf(" %lld", (long long)o.step);
  std::printf(" overflowed and were skipped (scale %.0f at the end); the %zu applied steps vs fp32 cpu skipping the "
              "same: losses max rel diff %.2e (tol %.0e)\n",
              skips.back().next, fp16.size(), worst, kFp16Tol);
  CHECK(worst < kFp16Tol);
  expect_falling(fp16, "fp16 emulated");
  fs::remove_all(b.dir);
}

namespace {

// Steps 1-10 with `first` (saved at the stop), 11-20 resumed from that
// checkpoint with `second`: the losses continue the CPU run's uninterrupted
// curve (1e-5) and end on its weights (1e-4). `label` names the run
// directories, so it holds no shell characters.
void check_crossing(const Setup& b, const std::string& label, const std::string& first, const std::string& second) {
  const std::string a = at(b, label + "_a"), c = at(b, label + "_b");
  std::string out;
  train(b, a, first + " --stop-after 10", &out);
  train(b, c, second + " --set checkpoint.resume=" + a + "/ckpt/step_00000010", &out);
  CHECK(out.find("resumed from " + a + "/ckpt/step_00000010 at step 10") != std::string::npos);
  CHECK(out.find(kDeviceLine) != std::string::npos);  // one of the two runs was emulated
  const std::vector<double> joined = e2e::joined_losses({a, c});
  REQUIRE(joined.size() == 20);
  const double worst = e2e::max_rel_diff(joined, losses_of(b.single()));
  const double w = e2e::weight_diff(fs::path(b.single()) / "ckpt/step_00000020", fs::path(c) / "ckpt/step_00000020");
  std::printf("[emu] checkpoint %s at step 10: losses max rel diff %.2e (tol 1e-5), final weights rel L2 %.2e "
              "(tol 1e-4) vs the uninterrupted cpu run\n",
              label.c_str(), worst, w);
  CHECK(worst < 1e-5);
  CHECK(w < 1e-4);
}

}  // namespace

TEST_CASE("emulated CUDA device: a checkpoint written there resumes on the CPU backend and the other way round",
          "[emu][e2e][emu_module]") {
  const EmulatedDevice device;
  const Setup b = make_bench("crossing", kLlama);
  check_crossing(b, "emulated-to-cpu", kEmuFp32, "");
  check_crossing(b, "cpu-to-emulated", "", kEmuFp32);
  fs::remove_all(b.dir);
}

namespace {

// Two ranks sharing the emulated device, their collectives staged through
// host memory and Gloo (the emulated NCCL is a one-rank stand-in), against
// the one-process CPU run (e2e::expect_same_run's tolerances).
void check_two_ranks(const std::string& name, const std::string& layout) {
  const EmulatedDevice device;
  const Setup b = make_bench(name, kLlama);
  std::string out;
  const int rc =
      e2e::run_by_hand(b.cfg, 2, at(b, name), &out, std::string(kEmuFp32) + " --set parallel.backend=host " + layout);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  CHECK(out.find(kDeviceLine) != std::string::npos);
  CHECK(out.find("host-staged gloo") != std::string::npos);
  e2e::expect_same_run(b.single(), "emu", name + " emulated (host backend) vs cpu", at(b, name));
  fs::remove_all(b.dir);
}

}  // namespace

TEST_CASE("emulated CUDA device: dp 2 through parallel.backend=host equals one CPU process",
          "[emu][e2e][emu_module]") {
  check_two_ranks("dp2", "--set parallel.dp=2");
}

TEST_CASE("emulated CUDA device: tp 2 through parallel.backend=host equals one CPU process",
          "[emu][e2e][emu_module]") {
  check_two_ranks("tp2", "--set parallel.tp=2");
}

// Two bugs no CPU run could show, found here: Gloo reduces no 16-bit type,
// and the host-staged backend handed it the BF16 gradients as they were
// ("reduce_scatter on group dp_cp: BF16 reductions are not supported on the
// CPU backend"); ZeRO-Offload converted them to F32 with the CPU backend's
// convert, which refused every dtype change. Every bf16 or fp16 run with
// several ranks on one GPU (parallel.backend host, as scripts/gpu-check.sh's
// mesh phase runs), or with offload, stopped at its first step.
TEST_CASE("emulated CUDA device: dp 2 in bf16 with ZeRO-1 and ZeRO-Offload through parallel.backend=host",
          "[emu][e2e][emu_module]") {
  const EmulatedDevice device;
  const Setup b = make_bench("dp2_bf16", kLlama);
  std::string out;
  const int rc = e2e::run_by_hand(b.cfg, 2, at(b, "dp2_bf16"), &out,
                                  "--set train.device=cuda --set train.precision=bf16 --set parallel.backend=host "
                                  "--set parallel.dp=2 --set parallel.zero_stage=1 --set optim.offload=optimizer");
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  CHECK(out.find("host-staged gloo") != std::string::npos);
  CHECK(out.find("storage BF16") != std::string::npos);
  expect_near_cpu(b, at(b, "dp2_bf16"), "dp2 ZeRO-1 offload bf16 emulated", kBf16Tol);
  fs::remove_all(b.dir);
}

// [serial]: the verdict's throughput check compares step times.
TEST_CASE("emulated CUDA device: the smoke test passes (bf16, the GPU default)", "[emu][e2e][emu_module][serial]") {
  const EmulatedDevice device;
  const Setup b = make_bench("smoke", kLlama);
  const std::string out = train_emulated(b, "smoke", "auto", "--smoke-test --steps 20");
  CHECK(out.find("storage BF16") != std::string::npos);
  const auto verdict = out.find("smoke test verdict");
  REQUIRE(verdict != std::string::npos);
  std::printf("[emu] %s", out.substr(verdict).c_str());
  CHECK(out.find("smoke test PASSED") != std::string::npos);
  for (const char* check : {"memory plan fits the device", "no NaN/Inf in loss or gradients", "loss falling",
                            "throughput stable", "checkpoint save -> load round trip"})
    CHECK(out.find(std::string("PASS  ") + check) != std::string::npos);
  fs::remove_all(b.dir);
}
