// A run never touches another run's checkpoints (train/run_identity.h,
// train/run_lock.h): the checkpoint root is locked even inside the run
// directory; a checkpoint.dir holding another run's checkpoints (another
// seed, or other training data) stops a run at start-up with exit 2 and is
// left as it was, unless checkpoint.load_foreign says to continue that run;
// a path in checkpoint.resume starts from another run on purpose. Resume
// auto takes the newest complete checkpoint even when `latest` names an
// older one, and a run that goes back (an explicit older step, a rollback)
// sets the newer timeline aside. A rollback passes over "unconfirmed"
// checkpoints (the last step's save, on which no step has run yet).
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "checkpoint/checkpoint.h"
#include "comm/process_group.h"
#include "config/config.h"
#include "e2e_util.h"
#include "train/run_lock.h"

namespace fs = std::filesystem;
using namespace trainer;
using Catch::Matchers::Contains;

namespace {

const std::string kBin = TRAINER_BIN;

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("trainer_identity_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Names under a checkpoint root, with the content of `latest`: what another
// run must not change.
std::string root_state(const fs::path& root) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.insert(e.path().filename().string());
  std::string s;
  for (const std::string& n : names) s += n + " ";
  return s + "| latest " + read_text(root / "latest");
}

// A small model on byte tokens (tokens.bin in `dir`), saved every 4 steps.
std::string write_config(const fs::path& dir, int64_t steps) {
  const fs::path tokens = e2e::write_byte_tokens(dir);
  const fs::path cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << "run: {name: identity, dir: " << (dir / "first").string() << ", seed: 1}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}\n"
                     << "train: {steps: " << steps << ", seq_len: 32, micro_batch_size: 4, global_batch_size: 8}\n"
                     << "optim: {lr: 3.0e-3, warmup_steps: 3}\n"
                     << "data: {train: [" << tokens.string() << "]}\n"
                     << "log: {interval: 4, progress: lines}\n"
                     << "checkpoint: {interval: 4, keep_last: 3, resume: auto}\n";
  return cfg.string();
}

int train_run(const std::string& cfg, const std::string& sets, std::string* out) {
  out->clear();
  return e2e::run(kBin + " --config " + cfg + " " + sets, out);
}

}  // namespace

TEST_CASE("another run's checkpoint.dir: locked while it trains, refused after, load_foreign or a path continue it",
          "[identity][safety][e2e]") {
  const fs::path dir = fresh_dir("foreign");
  const std::string cfg = write_config(dir, 12);
  const fs::path root = dir / "first/ckpt";
  std::string out;
  REQUIRE(train_run(cfg, "", &out) == 0);
  const std::string before = root_state(root);
  const std::string second = "--set run.dir=" + (dir / "second").string() + " --set checkpoint.dir=" + root.string();

  {
    // While the first run trains it holds what its own RunLock takes: the
    // run directory and, though it lies inside, the checkpoint root.
    const Config c = load_config_file(cfg, {});
    SingleRankCommunicator host("host", 0, Device::CPU);
    RunLock held(c, true, host);
    CHECK(held.files().size() == 2);
    const int rc = train_run(cfg, second + " --set run.seed=7", &out);
    INFO(e2e::tail(out));
    std::printf("[identity] a second run on the checkpoint root of one that trains: exit %d\n", rc);
    CHECK(rc == 2);
    CHECK_THAT(out, Contains(root.string() + " is in use by another trainer"));
  }
  // Another seed, then other training data: exit 2 whether it would resume
  // (auto) or start over (none, whose saves would rotate the first run's away).
  for (const char* mode : {"auto", "none"}) {
    const int rc = train_run(cfg, second + " --set run.seed=7 --set checkpoint.resume=" + std::string(mode), &out);
    INFO(e2e::tail(out));
    std::printf("[identity] seed 7 on seed 1's checkpoints, resume %s: exit %d\n", mode, rc);
    CHECK(rc == 2);
    CHECK_THAT(out, Contains("checkpoint.dir " + root.string() + " holds 3 checkpoint(s) of another run") &&
                        Contains("seed 1 (this run: 7)") && Contains("checkpoint.load_foreign: true"));
    CHECK_THAT(out, !Contains("resumed from"));
  }
  std::ofstream(dir / "other.bin", std::ios::binary) << read_text(dir / "tokens.bin").substr(2);
  REQUIRE(train_run(cfg, second + " --set data.train=[" + (dir / "other.bin").string() + "]", &out) == 2);
  CHECK_THAT(out, Contains("the training data"));
  CHECK(root_state(root) == before);  // nothing deleted, `latest` unchanged

  // A path in checkpoint.resume starts from it on purpose, into a root of
  // the second run's own.
  REQUIRE(train_run(cfg, "--set run.dir=" + (dir / "third").string() + " --set run.seed=7 --set train.steps=16" +
                           " --set checkpoint.resume=" + (root / "step_00000012").string(),
                  &out) == 0);
  CHECK_THAT(out, Contains("was written by another run (seed 1 (this run: 7)); continuing it as checkpoint.resume names it"));
  CHECK_THAT(out, Contains("resumed from " + (root / "step_00000012").string()));
  CHECK(root_state(root) == before);

  // load_foreign: continues the first run in its root; the first run is in
  // the lineage of what it writes, so its relaunches need no flag.
  REQUIRE(train_run(cfg, second + " --set run.seed=7 --set train.steps=16 --set checkpoint.load_foreign=true", &out) == 0);
  CHECK_THAT(out, Contains("taken as this run's (checkpoint.load_foreign: true)"));
  CHECK_THAT(out, Contains("resumed from " + (root / "step_00000012").string()));
  const CheckpointMeta m16 = read_checkpoint_meta((root / "step_00000016").string());
  const CheckpointMeta m12 = read_checkpoint_meta((root / "step_00000012").string());
  CHECK(m16.identity.lineage == std::vector<std::string>{m12.identity.id});
  CHECK(m16.identity.id != m12.identity.id);
  REQUIRE(train_run(cfg, second + " --set run.seed=7 --set train.steps=20", &out) == 0);
  CHECK_THAT(out, Contains("resumed from " + (root / "step_00000016").string()));
  // The first run, relaunched, now finds the second run's checkpoints there.
  CHECK(train_run(cfg, "--set train.steps=24", &out) == 2);
  CHECK_THAT(out, Contains("of another run") && Contains("seed 7 (this run: 1)"));
  fs::remove_all(dir);
}

TEST_CASE("resume auto takes the newest complete checkpoint over an older `latest`, going back sets newer ones aside",
          "[identity][resume][e2e]") {
  const fs::path dir = fresh_dir("latest");
  const std::string cfg = write_config(dir, 12);
  const fs::path root = dir / "first/ckpt";
  std::string out;
  REQUIRE(train_run(cfg, "", &out) == 0);
  // A kill between publishing step 12 and replacing `latest`.
  std::ofstream(root / "latest") << "step_00000008\n";
  REQUIRE(train_run(cfg, "--set train.steps=14", &out) == 0);
  CHECK_THAT(out, Contains("resumed from " + (root / "step_00000012").string()));
  CHECK_THAT(out, Contains("`latest` in " + root.string() + " names step 8, but step 12 is newer and complete"));

  // An explicit older step: the steps after it are another timeline now.
  REQUIRE(train_run(cfg, "--set train.steps=10 --set checkpoint.resume=" + (root / "step_00000008").string(), &out) == 0);
  CHECK_THAT(out, Contains("2 checkpoint(s) newer than step 8 belong to a timeline this run left; set aside"));
  CHECK(fs::exists(root / "step_00000012.superseded"));
  CHECK(fs::exists(root / "step_00000014.superseded"));
  CHECK(read_text(root / "latest") == "step_00000010\n");
  REQUIRE(train_run(cfg, "--set train.steps=11", &out) == 0);
  CHECK_THAT(out, Contains("resumed from " + (root / "step_00000010").string()));
  CHECK(fs::exists(root / "step_00000012.superseded"));  // pruning leaves them alone
  fs::remove_all(dir);
}

TEST_CASE("a rollback passes over the last step's unconfirmed save unless a step ran healthy on it",
          "[identity][policy][e2e]") {
  const fs::path dir = fresh_dir("verdict");
  const std::string cfg = write_config(dir, 8);
  const fs::path root = dir / "first/ckpt";
  std::string out;
  REQUIRE(train_run(cfg, "", &out) == 0);
  CHECK(read_checkpoint_meta((root / "step_00000004").string()).verdict == kVerdictHealthy);
  CHECK(read_checkpoint_meta((root / "step_00000008").string()).verdict == kVerdictUnconfirmed);
  fs::copy(dir / "first", dir / "copy", fs::copy_options::recursive);
  const std::string rollback = " --set train.steps=12 --set train.nonfinite=rollback --set train.nonfinite_limit=0";

  // Step 9 is the first step on step 8's state and is flagged: step 8 was
  // never confirmed, so the rollback goes to step 4 and sets 8 aside.
  setenv("TRAINER_TEST_HOOKS", "skip=*:9", 1);
  const int rc = train_run(cfg, rollback, &out);
  INFO(e2e::tail(out));
  CHECK(rc == 0);
  CHECK_THAT(out, Contains("rolled back to " + (root / "step_00000004").string() + " (step 4)"));
  CHECK(fs::exists(root / "step_00000008.superseded"));

  // Step 10 flagged: step 9 ran healthy on step 8's state, which this run
  // resumed from, so the rollback may stop there.
  setenv("TRAINER_TEST_HOOKS", "skip=*:10", 1);
  const fs::path copy = dir / "copy/ckpt";
  const int rc2 = train_run(cfg, rollback + " --set run.dir=" + (dir / "copy").string(), &out);
  unsetenv("TRAINER_TEST_HOOKS");
  INFO(e2e::tail(out));
  CHECK(rc2 == 0);
  CHECK_THAT(out, Contains("rolled back to " + (copy / "step_00000008").string() + " (step 8)"));
  fs::remove_all(dir);
}
