// Quick runs without friction: `--set train.steps=10` on any shipped config
// must start. A warm-up longer than the run (or than decay_steps) is a
// warning, and the learning-rate schedule stays finite and sensible then.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "config/config.h"
#include "e2e_util.h"
#include "optim/lr_schedule.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

size_t count_of(const std::string& s, const std::string& part) {
  size_t n = 0;
  for (size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("lr schedule: a warm-up longer than the run keeps rising, finite", "[loop]") {
  // tiny.yaml's warm-up of 30 under --set train.steps=10 (decay_steps 0 ->
  // the engine passes train.steps).
  const LrSchedule s{"cosine", 3e-3, 3e-4, 30, 10};
  double prev = 0;
  for (int64_t step = 0; step < 10; ++step) {
    const double lr = learning_rate(s, step);
    INFO("step " << step << " lr " << lr);
    CHECK(std::isfinite(lr));
    CHECK(lr == Approx(3e-3 * double(step + 1) / 30.0));
    CHECK(lr > prev);
    CHECK(lr < 3e-3);
    prev = lr;
  }
  std::printf("[lr] warm-up 30 over a 10-step run: step 0 %.3e, step 9 %.3e (peak 3e-3 never reached)\n",
              learning_rate(s, 0), learning_rate(s, 9));
}

TEST_CASE("lr schedule: a warm-up longer than decay_steps, then min_lr", "[loop]") {
  for (const char* kind : {"cosine", "linear", "constant"}) {
    const LrSchedule s{kind, 1.0, 0.1, 50, 10};
    INFO(kind);
    for (int64_t step = 0; step < 100; ++step) CHECK(std::isfinite(learning_rate(s, step)));
    CHECK(learning_rate(s, 0) == Approx(1.0 / 50));
    CHECK(learning_rate(s, 9) == Approx(10.0 / 50));   // the warm-up ignores decay_steps
    CHECK(learning_rate(s, 49) == Approx(1.0));        // and reaches the peak at its end
    const double after = std::string(kind) == "constant" ? 1.0 : 0.1;
    CHECK(learning_rate(s, 50) == Approx(after));      // no one-step spike: the decay is over
    CHECK(learning_rate(s, 99) == Approx(after));
    std::printf("[lr] %s, warm-up 50 > decay_steps 10: step 9 %.3f, step 49 %.3f, step 50 %.3f\n", kind,
                learning_rate(s, 9), learning_rate(s, 49), learning_rate(s, 50));
  }
  // Degenerate windows stay finite: nothing divides by zero.
  for (const LrSchedule& s : {LrSchedule{"cosine", 1.0, 0.1, 0, 0}, LrSchedule{"linear", 1.0, 0.1, 10, 10},
                              LrSchedule{"cosine", 1.0, 0.1, 1, 1}}) {
    for (int64_t step = 0; step < 20; ++step) CHECK(std::isfinite(learning_rate(s, step)));
    CHECK(learning_rate(s, 19) == Approx(0.1));
  }
  // The ordinary schedule is unchanged: warm-up 10, decay over 100 more steps.
  const LrSchedule s{"cosine", 1.0, 0.1, 10, 110};
  CHECK(learning_rate(s, 10) == Approx(1.0));
  CHECK(learning_rate(s, 60) == Approx(0.55));
  CHECK(learning_rate(s, 110) == Approx(0.1));
}

TEST_CASE("config: a warm-up longer than the run or the decay is a warning, not an error", "[config]") {
  const std::string data = "data: {train: [x.bin]}\n";
  const Config run = load_config_text(data + "train: {steps: 10}\noptim: {warmup_steps: 30}\n", "a.yaml", {});
  const auto w = config_warnings(run);
  REQUIRE(w.size() == 1);
  std::printf("[warn] %s\n", w[0].c_str());
  CHECK_THAT(w[0], Catch::Contains("a.yaml") && Catch::Contains("optim.warmup_steps=30") &&
                       Catch::Contains("train.steps=10") && Catch::Contains("0.333 x optim.lr"));

  const Config decay = load_config_text(data + "optim: {warmup_steps: 50, decay_steps: 10}\n", "b.yaml", {});
  const auto wd = config_warnings(decay);
  REQUIRE(wd.size() == 1);
  std::printf("[warn] %s\n", wd[0].c_str());
  CHECK_THAT(wd[0], Catch::Contains("optim.warmup_steps=50") && Catch::Contains("optim.decay_steps=10") &&
                        Catch::Contains("optim.min_lr"));

  const Config fine = load_config_text(data + "train: {steps: 100}\noptim: {warmup_steps: 100}\n", "c.yaml", {});
  CHECK(config_warnings(fine).empty());
}

TEST_CASE("every shipped config runs with --set train.steps=10", "[config][binary]") {
  const std::string bin = TRAINER_BIN;
  const fs::path dir = fs::temp_directory_path() / ("trainer_quick_runs_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string tokens = e2e::write_byte_tokens(dir).string();

  std::vector<fs::path> configs;
  for (const auto& e : fs::directory_iterator(fs::path(TRAINER_SOURCE_DIR) / "configs"))
    if (e.path().extension() == ".yaml") configs.push_back(e.path());
  std::sort(configs.begin(), configs.end());
  REQUIRE(configs.size() >= 4);
  int ran = 0;
  for (const fs::path& cfg : configs) {
    INFO(cfg.string());
    std::string out;
    // A recipe that starts from a Hugging Face directory takes its model keys from that
    // directory's config.json, which only its walk-through makes: configs/sft.yaml runs in
    // doc_commands, after docs/FINE_TUNE.md's export.
    if (std::ifstream in(cfg); std::string((std::istreambuf_iterator<char>(in)), {}).find("init_from:") !=
                               std::string::npos) {
      std::printf("[configs] %s: starts from model.init_from, run by doc_commands (docs/FINE_TUNE.md)\n",
                  cfg.filename().c_str());
      continue;
    }
    // A layout of several processes (configs/plan_7b.yaml, 32 GPUs) is a
    // planning example: `trainer plan` must take it, nothing is launched.
    const Config layout = load_config_file(cfg.string(), {"train.steps=10"}, 0);
    const auto& p = layout.parallel;
    if (p.tp * p.pp * p.cp * std::max(p.dp, 1) > 1) {
      const int rc = e2e::run(bin + " plan --config " + cfg.string() + " --set train.steps=10", &out);
      INFO(out);
      CHECK(rc == 0);
      CHECK_THAT(out, Catch::Contains("estimate (a prediction, not a measurement)"));
      std::printf("[configs] %s: trainer plan exit %d\n", cfg.filename().c_str(), rc);
      continue;
    }
    const int rc = e2e::run(bin + " --config " + cfg.string() + " --set train.steps=10 --print-config", &out);
    CHECK(rc == 0);
    CHECK_THAT(out, Catch::Contains("steps: 10"));
    // A recipe that warms up for more than 10 steps (tiny, quickstart) warns
    // exactly once; one that does not, not at all.
    const Config c = load_config_file(cfg.string(), {"train.steps=10"}, 0);
    const size_t warned = count_of(out, "warning: ");
    CHECK(warned == config_warnings(c).size());
    std::printf("[configs] %s --set train.steps=10 --print-config: exit %d, %zu warning(s)\n",
                cfg.filename().c_str(), rc, warned);
    if (c.train.device == "cuda") continue;  // the GPU benchmarks: checked by --print-config only

    // A real 10-step run on the CPU, on byte tokens instead of the config's
    // own data (which the test does not prepare).
    const fs::path run_dir = dir / cfg.stem();
    std::string log;
    const int code = e2e::run(bin + " --config " + cfg.string() + " --set train.steps=10 --set train.device=cpu" +
                                  " --set data.train=" + tokens + " --set data.valid=" + tokens +
                                  " --set run.dir=" + run_dir.string() +
                                  " --set log.sample_tokens=0 --set checkpoint.resume=none --set log.interval=5",
                              &log);
    INFO(log);
    CHECK(code == 0);
    const auto losses = e2e::losses(run_dir / "metrics.jsonl");
    CHECK(losses.size() == 2);  // steps 5 and 10
    for (double l : losses) CHECK(std::isfinite(l));
    CHECK(count_of(log, "warning: ") == config_warnings(c).size());
    std::printf("[configs] %s: 10 steps on the CPU, exit %d, loss at step 10 %.4f\n", cfg.filename().c_str(),
                code, losses.empty() ? NAN : losses.back());
    ++ran;
  }
  CHECK(ran >= 2);  // tiny and quickstart
  fs::remove_all(dir);
}
