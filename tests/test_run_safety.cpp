// The trainer binary refuses to go wrong quietly: every checkpoint damaged
// under resume: auto (exit 1 naming each), a run directory in use (exit 2
// naming the holder, released by kill -9), and a failing save under
// checkpoint.on_save_error stop (exit 1, `latest` unchanged) and continue
// (trains on, saves again).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e_util.h"
#include "train/run_lock.h"

namespace fs = std::filesystem;
using namespace trainer;
using Catch::Matchers::Contains;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("trainer_safety_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A 20-step run of a small model on byte tokens, logged every step, its
// run directory dir/run; `checkpoint` is the YAML flow map of that section.
std::string write_config(const fs::path& dir, const std::string& checkpoint, int64_t steps = 20) {
  const fs::path tokens = e2e::write_byte_tokens(dir);
  const fs::path cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << "run: {name: safety, dir: " << (dir / "run").string() << "}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}\n"
                     << "train: {steps: " << steps << ", seq_len: 32, micro_batch_size: 4, global_batch_size: 8}\n"
                     << "optim: {lr: 3.0e-3, warmup_steps: 3}\n"
                     << "data: {train: [" << tokens.string() << "]}\n"
                     << "log: {interval: 1, progress: lines}\n"
                     << "parallel: {timeout_s: 60}\n"
                     << "checkpoint: " << checkpoint << "\n";
  return cfg.string();
}

void flip_byte(const fs::path& p, uint64_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  char c = 0;
  f.seekg(std::streamoff(at));
  f.read(&c, 1);
  c = char(c ^ 0x04);
  f.seekp(std::streamoff(at));
  f.write(&c, 1);
}

// Logged training steps: the rows of metrics.jsonl with a loss (time and
// expert-load records share the file).
size_t lines(const fs::path& p) {
  std::istringstream in(read_text(p));
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"loss\": ") != std::string::npos;
  return n;
}

const std::string kBin = TRAINER_BIN;

}  // namespace

TEST_CASE("resume auto: every checkpoint damaged stops with exit 1 naming each, none starts over explicitly",
          "[resume][safety][e2e]") {
  const fs::path dir = fresh_dir("damaged");
  const std::string cfg = write_config(dir, "{interval: 10, keep_last: 3, resume: auto}");
  std::string out;
  REQUIRE(e2e::run(kBin + " --config " + cfg, &out) == 0);
  const fs::path root = dir / "run/ckpt";
  // One damaged rank file, one damaged manifest (inside its config text).
  const fs::path shard = root / "step_00000020/rank_00000.safetensors";
  flip_byte(shard, fs::file_size(shard) / 2);
  const fs::path manifest = root / "step_00000010/manifest.json";
  flip_byte(manifest, read_text(manifest).find("\"config_yaml\"") + 40);
  const size_t rows = lines(dir / "run/metrics.jsonl");

  out.clear();
  const int rc = e2e::run(kBin + " --config " + cfg, &out);
  INFO(e2e::tail(out));
  std::printf("[safety] resume auto over 2 damaged checkpoints: exit %d\n", rc);
  CHECK(rc == 1);
  CHECK_THAT(out, Contains("2 checkpoint(s) under " + root.string() + ", none loadable"));
  CHECK_THAT(out, Contains(shard.string()) && Contains("CRC32C mismatch"));
  CHECK_THAT(out, Contains(manifest.string()) && Contains("manifest checksum mismatch"));
  CHECK_THAT(out, Contains("checkpoint.resume=none"));
  CHECK_THAT(out, !Contains("starting from step 0"));
  CHECK(lines(dir / "run/metrics.jsonl") == rows);  // nothing trained, nothing logged

  // Starting over is asked for by name.
  out.clear();
  CHECK(e2e::run(kBin + " --config " + cfg + " --set checkpoint.resume=none --stop-after 2", &out) == 0);
  CHECK_THAT(out, !Contains("resumed from"));
  fs::remove_all(dir);
}

TEST_CASE("run lock: a run directory in use stops a second trainer with exit 2 naming the holder",
          "[lock][safety][e2e]") {
  const fs::path dir = fresh_dir("lock");
  const std::string cfg = write_config(dir, "{interval: 0}");
  const std::string me = "pid " + std::to_string(::getpid()) + " on host ";
  {
    // Held by this process through the trainer's own lock.
    DirectoryLock held((dir / "run").string());
    std::string out;
    const int rc = e2e::run(kBin + " --config " + cfg + " --stop-after 2", &out);
    INFO(e2e::tail(out));
    CHECK(rc == 2);
    CHECK_THAT(out, Contains((dir / "run").string() + " is in use by another trainer: " + me));
    CHECK_THAT(out, Contains("trainer.lock"));

    // Every rank of a job stops; rank 0 names the holder.
    out.clear();
    std::vector<int> codes;
    e2e::run_by_hand(cfg, 2, (dir / "run").string(), &out, "--stop-after 2", &codes);
    std::printf("[safety] 2-rank job on a locked run directory: exits %d %d\n", codes[0], codes[1]);
    CHECK(codes == std::vector<int>{2, 2});
    CHECK_THAT(out, Contains(me) && Contains("rank 0 found the run directory"));

    // A checkpoint.dir outside the run directory is locked too.
    out.clear();
    CHECK(e2e::run(kBin + " --config " + cfg + " --set run.dir=" + (dir / "other").string() +
                       " --set checkpoint.dir=" + (dir / "run").string() +
                       " --set checkpoint.interval=1 --stop-after 2",
                   &out) == 2);
    CHECK_THAT(out, Contains(me));

    // The smoke test of a job uses <run dir>/smoke-test, which it locks
    // itself: it runs while the real run holds the run directory.
    out.clear();
    codes.clear();
    e2e::run_by_hand(cfg, 2, (dir / "run").string(), &out, "--set train.steps=40 --smoke-test", &codes);
    const std::string log0 = read_text((dir / "run").string() + ".rank0.log");
    INFO(e2e::tail(out));
    e2e::check_smoke(log0, codes);
  }
  std::string out;
  CHECK(e2e::run(kBin + " --config " + cfg + " --stop-after 2", &out) == 0);  // released
  fs::remove_all(dir);
}

TEST_CASE("run lock: a second trainer while the first trains exits 2 naming it, kill -9 frees the directory",
          "[lock][safety][e2e]") {
  const fs::path dir = fresh_dir("two");
  const std::string cfg = write_config(dir, "{interval: 0}", 1000000);
  const fs::path log = dir / "first.log";
  std::fflush(stdout);  // the child must not inherit (and re-print) buffered output
  const pid_t first = ::fork();
  REQUIRE(first >= 0);
  if (first == 0) {
    ::freopen(log.c_str(), "w", stdout);
    ::execl(TRAINER_BIN, TRAINER_BIN, "--config", cfg.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  // Until it has logged two steps: it holds the lock by then.
  bool stepping = false;
  for (int i = 0; i < 600 && !stepping; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stepping = fs::exists(dir / "run/metrics.jsonl") && lines(dir / "run/metrics.jsonl") >= 2;
  }
  REQUIRE(stepping);
  std::string out;
  const int rc = e2e::run(kBin + " --config " + cfg + " --stop-after 2", &out);
  std::printf("[safety] second trainer while pid %d trains: exit %d\n", int(first), rc);
  {
    INFO(e2e::tail(out));
    CHECK(rc == 2);
    CHECK_THAT(out, Contains("is in use by another trainer: pid " + std::to_string(first) + " on host "));
  }
  ::kill(first, SIGKILL);
  int st = 0;
  ::waitpid(first, &st, 0);
  CHECK(WIFSIGNALED(st));
  out.clear();
  CHECK(e2e::run(kBin + " --config " + cfg + " --stop-after 2", &out) == 0);  // the kernel dropped the lock
  fs::remove_all(dir);
}

TEST_CASE("on_save_error: stop exits 1 naming the directory with latest unchanged, continue trains on",
          "[checkpoint][safety][e2e]") {
  // The second save (step 10) fails as on a read-only filesystem.
  const std::string fault = "TRAINER_TEST_CHECKPOINT_FAULT=prepare:EROFS:1:1 ";
  for (const char* async : {"false", "true"}) {
    INFO("async " << async);
    {
      const fs::path dir = fresh_dir(std::string("stop_") + async);
      const std::string cfg = write_config(dir, std::string("{interval: 5, keep_last: 5, async: ") + async + "}");
      std::string out;
      const int rc = e2e::run(fault + kBin + " --config " + cfg, &out);
      INFO(e2e::tail(out));
      const fs::path root = dir / "run/ckpt";
      const size_t steps = lines(dir / "run/metrics.jsonl");
      std::printf("[safety] on_save_error=stop, async %s: exit %d after %zu steps, latest %s", async, rc, steps,
                  read_text(root / "latest").c_str());
      CHECK(rc == 1);
      CHECK_THAT(out, Contains("checkpoint save of step 10 under " + root.string() + " failed") &&
                          Contains((root / "step_00000010.partial").string()) && Contains("Read-only file system"));
      CHECK(read_text(root / "latest") == "step_00000005\n");
      CHECK(!fs::exists(root / "step_00000010"));
      // Step 10's snapshot is written once step 11 has run healthy on it: a
      // synchronous save fails then; a background one is found at the next write.
      CHECK(steps == (std::string(async) == "true" ? 16u : 11u));
      fs::remove_all(dir);
    }
    {
      const fs::path dir = fresh_dir(std::string("continue_") + async);
      const std::string cfg =
          write_config(dir, std::string("{interval: 5, keep_last: 5, async: ") + async + ", on_save_error: continue}");
      std::string out;
      const int rc = e2e::run(fault + kBin + " --config " + cfg, &out);
      INFO(e2e::tail(out));
      const fs::path root = dir / "run/ckpt";
      std::printf("[safety] on_save_error=continue, async %s: exit %d, %zu steps, latest %s", async, rc,
                  lines(dir / "run/metrics.jsonl"), read_text(root / "latest").c_str());
      CHECK(rc == 0);
      CHECK_THAT(out, Contains("checkpoint: ERROR: checkpoint save of step 10 under " + root.string()) &&
                          Contains("Read-only file system") && Contains("training goes on"));
      CHECK(lines(dir / "run/metrics.jsonl") == 20);
      CHECK(read_text(root / "latest") == "step_00000020\n");
      CHECK(!fs::exists(root / "step_00000010"));
      CHECK(fs::exists(root / "step_00000015/manifest.json"));
      fs::remove_all(dir);
    }
  }
}
