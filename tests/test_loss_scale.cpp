// Dynamic loss scaling (optim/loss_scale.h) in the training loop. Scales are
// powers of two, so in fp32 on the CPU a run with scaling must equal the run
// without it bit for bit, growth steps included: a growth applied before the
// optimizer step that used the old scale would halve that step's gradient and
// the curves would part.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "optim/loss_scale.h"
#include "config/config.h"
#include "train/engine.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

std::string token_file() {
  static std::string path;
  if (!path.empty()) return path;
  const fs::path dir = fs::temp_directory_path() / ("loss_scale_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(text.size() > 10000);
  std::vector<uint16_t> toks(text.begin(), text.end());
  path = (dir / "tokens.bin").string();
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  return path;
}

TrainSummary train(const std::vector<std::string>& overrides) {
  const std::string yaml =
      "run: {dir: " + (fs::temp_directory_path() / ("loss_scale_run_" + std::to_string(::getpid()))).string() +
      "}\nmodel: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32}\n"
      "train: {device: cpu, steps: 12, seq_len: 32, micro_batch_size: 2, global_batch_size: 4, threads: 1}\n"
      "optim: {lr: 3.0e-3, warmup_steps: 2}\n"
      "data: {train: [" + token_file() + "]}\nlog: {interval: 100, jsonl: false, progress: lines}\n";
  RunOptions opt;
  opt.quiet = true;
  return run_training(load_config_text(yaml, "<loss scale test>", overrides), opt);
}

}  // namespace

TEST_CASE("loss scaler: grows after the step that used the scale, halves on overflow", "[loop][loss_scale]") {
  LossScaler s(true, 1024, 2);
  CHECK(s.scale() == 1024);
  s.step_applied();
  CHECK(s.scale() == 1024);
  s.step_applied();
  CHECK(s.scale() == 2048);  // the second good step in a row grows it, after that step
  s.overflow();
  CHECK(s.scale() == 1024);
  s.step_applied();
  CHECK(s.scale() == 1024);  // the overflow restarted the window
  s.step_applied();
  CHECK(s.scale() == 2048);
  LossScaler off(false, 1024, 2);
  off.overflow();
  off.step_applied();
  CHECK(off.scale() == 1);
}

TEST_CASE("dynamic loss scaling with growth every 2 steps equals the unscaled fp32 run bit for bit",
          "[loop][loss_scale]") {
  const TrainSummary plain = train({});
  const TrainSummary scaled = train(
      {"train.loss_scaling=dynamic", "train.initial_loss_scale=1024", "train.loss_scale_window=2"});
  REQUIRE(plain.losses.size() == 12);
  REQUIRE(scaled.losses.size() == 12);
  CHECK(scaled.skipped_steps.empty());
  // The scale doubled after steps 2, 4, ...: steps 3-4 ran at 2048, 11-12 at 32768.
  REQUIRE(scaled.loss_scales.size() == 12);
  CHECK(scaled.loss_scales[0] == 1024);
  CHECK(scaled.loss_scales[2] == 2048);
  CHECK(scaled.loss_scales[11] == 32768);
  double worst_loss = 0, worst_norm = 0;
  for (size_t i = 0; i < plain.losses.size(); ++i) {
    worst_loss = std::max(worst_loss, std::fabs(scaled.losses[i] - plain.losses[i]) / plain.losses[i]);
    worst_norm = std::max(worst_norm, std::fabs(scaled.grad_norms[i] - plain.grad_norms[i]) / plain.grad_norms[i]);
  }
  std::printf("[loss scale] 12 steps, scale 1024 doubling every 2: loss %.6f -> %.6f, max rel diff vs unscaled: "
              "loss %.3e, grad norm %.3e (tolerance 0: powers of two are exact)\n",
              scaled.losses.front(), scaled.losses.back(), worst_loss, worst_norm);
  CHECK(worst_loss == 0);
  CHECK(worst_norm == 0);
}

TEST_CASE("an overflowing loss scale skips steps and halves until the gradients are finite", "[loop][loss_scale]") {
  // 2^136 / (2 micro-batches x 64 tokens) is past fp32's range: the loss
  // gradient is infinite until the scale has halved a few times.
  const TrainSummary s = train({"train.loss_scaling=dynamic", "train.initial_loss_scale=8.711228593176025e+40"});
  size_t leading = 0;  // skipped steps before the first applied one
  while (leading < s.skipped_steps.size() && s.skipped_steps[leading] == int64_t(leading) + 1) ++leading;
  std::printf("[loss scale] initial 2^136: %zu steps skipped (%zu before the first applied), first applied scale "
              "2^%.0f, %zu steps applied, loss %.4f -> %.4f\n",
              s.skipped_steps.size(), leading, s.loss_scales.empty() ? 0.0 : std::log2(s.loss_scales.front()),
              s.losses.size(), s.losses.empty() ? 0.0 : s.losses.front(), s.losses.empty() ? 0.0 : s.losses.back());
  CHECK(leading >= 2);  // 2^135 / 128 = 2^128 still overflows in fp32
  CHECK(s.losses.size() + s.skipped_steps.size() == 12);
  REQUIRE(!s.losses.empty());
  CHECK(s.loss_scales.front() == std::ldexp(1.0, 136 - int(leading)));
  for (double l : s.losses) CHECK(std::isfinite(l));
}
