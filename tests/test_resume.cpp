// Checkpoints through the real binary: exact resume (bitwise), kill -9 while a
// checkpoint is being written, a corrupted shard, and the smoke-test verdicts.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("trainer_resume_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

int run(const std::string& cmd, std::string* out) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// English bytes as uint16 tokens: the licenses every Debian system ships.
std::string make_tokens(const fs::path& dir) {
  std::vector<uint16_t> toks;
  for (const char* f : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/GPL-2"}) {
    std::ifstream in(f, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (unsigned char c : text) toks.push_back(c);
  }
  const fs::path p = dir / "tokens.bin";
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(toks.data()), std::streamsize(toks.size() * 2));
  return p.string();
}

std::string write_config(const fs::path& dir, const std::string& tokens, const std::string& extra) {
  const fs::path cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << "run: {name: r, dir: " << (dir / "run").string() << "}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}\n"
                     << "train: {steps: 40, seq_len: 32, micro_batch_size: 4, global_batch_size: 8}\n"
                     << "optim: {lr: 3.0e-3, warmup_steps: 5}\n"
                     << "data: {train: [" << tokens << "]}\n"
                     << "log: {interval: 1, progress: lines}\n"
                     << extra;
  return cfg.string();
}

std::vector<std::string> loss_fields(const fs::path& metrics) {
  std::vector<std::string> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    const auto k = line.find("\"loss\": ");
    if (k != std::string::npos) out.push_back(line.substr(k + 8, line.find(',', k) - k - 8));
  }
  return out;
}

void flip_middle_byte(const fs::path& p) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = std::streamoff(fs::file_size(p) / 2);
  char c = 0;
  f.seekg(at);
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("40 steps straight == 20 steps, stop, resume, 20 steps (bitwise)", "[resume][e2e]") {
  const fs::path dir = fresh_dir("exact");
  const std::string tokens = make_tokens(dir);
  const std::string bin = TRAINER_BIN;

  const fs::path a = dir / "a", b = dir / "b";
  fs::create_directories(a);
  fs::create_directories(b);
  const std::string ck = "checkpoint: {interval: 20, keep_last: 5, resume: auto}\n";
  std::string out;
  REQUIRE(run(bin + " --config " + write_config(a, tokens, ck), &out) == 0);
  out.clear();
  REQUIRE(run(bin + " --config " + write_config(b, tokens, ck) + " --stop-after 20", &out) == 0);
  REQUIRE(fs::exists(b / "run/ckpt/step_00000020"));
  REQUIRE_FALSE(fs::exists(b / "run/ckpt/step_00000040"));
  out.clear();
  const int rc = run(bin + " --config " + (b / "cfg.yaml").string(), &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK_THAT(out, Catch::Contains("resumed from") && Catch::Contains("at step 20"));

  const auto la = loss_fields(a / "run/metrics.jsonl"), lb = loss_fields(b / "run/metrics.jsonl");
  REQUIRE(la.size() == 40);
  REQUIRE(lb.size() == 40);
  for (size_t i = 0; i < la.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(la[i] == lb[i]);  // printed with 17 significant digits: equal text is equal bits
  }
  // Weights and optimizer state after step 40, byte for byte.
  CHECK(file_bytes(a / "run/ckpt/step_00000040/rank_00000.safetensors") ==
        file_bytes(b / "run/ckpt/step_00000040/rank_00000.safetensors"));
  std::printf("[resume] 40 losses and the step-40 shard are identical (last loss %s)\n", la.back().c_str());
  fs::remove_all(dir);
}

TEST_CASE("kill -9 while checkpoints are written never leaves a loadable partial", "[resume][crash][serial]") {
  const fs::path dir = fresh_dir("crash");
  const std::string tokens = make_tokens(dir);
  // A wider model makes every save take long enough to be caught mid-write;
  // a checkpoint every step keeps the writer busy all the time.
  const fs::path cfg = dir / "cfg.yaml";
  std::ofstream(cfg) << "run: {name: c, dir: " << (dir / "run").string() << "}\n"
                     << "model: {arch: llama, d_model: 256, n_layers: 4, n_heads: 4, max_seq_len: 16}\n"
                     << "train: {steps: 100000, seq_len: 16, micro_batch_size: 1, global_batch_size: 1}\n"
                     << "optim: {lr: 1.0e-3, warmup_steps: 0}\n"
                     << "data: {train: [" << tokens << "]}\n"
                     << "log: {interval: 1000, progress: lines, jsonl: false}\n"
                     << "checkpoint: {interval: 1, keep_last: 2, async: true, resume: auto}\n";
  const fs::path root = dir / "run/ckpt";
  int64_t last_step = 0;
  const int delays_ms[] = {150, 420, 800, 1330, 1900, 2600};
  for (int round = 0; round < 6; ++round) {
    std::fflush(stdout);  // the child must not inherit (and re-print) buffered output
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::freopen("/dev/null", "w", stdout);
      ::execl(TRAINER_BIN, TRAINER_BIN, "--config", cfg.c_str(), (char*)nullptr);
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delays_ms[round]));
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    REQUIRE(WIFSIGNALED(st));

    bool saw_partial = false;
    if (fs::exists(root))
      for (const auto& e : fs::directory_iterator(root))
        saw_partial |= e.path().filename().string().find(".partial") != std::string::npos;
    auto ck = resolve_resume(root.string(), "auto");
    if (ck) {
      CHECK(ck->dir.find(".partial") == std::string::npos);
      CHECK(ck->meta.step >= last_step);  // progress is never lost
      last_step = ck->meta.step;
    }
    std::printf("[crash] round %d: killed after %d ms, partial dir present: %s, resume -> %s\n", round,
                delays_ms[round], saw_partial ? "yes" : "no", ck ? ck->dir.c_str() : "(none yet)");
  }
  CHECK(last_step > 0);
  fs::remove_all(dir);
}

TEST_CASE("a flipped byte is refused and auto falls back to the previous checkpoint", "[resume][e2e]") {
  const fs::path dir = fresh_dir("flip");
  const std::string tokens = make_tokens(dir);
  const std::string cfg = write_config(dir, tokens, "checkpoint: {interval: 10, keep_last: 3, resume: auto}\n");
  std::string out;
  REQUIRE(run(std::string(TRAINER_BIN) + " --config " + cfg + " --stop-after 20", &out) == 0);
  const fs::path shard = dir / "run/ckpt/step_00000020/rank_00000.safetensors";
  REQUIRE(fs::exists(shard));
  flip_middle_byte(shard);
  out.clear();
  CHECK(run(std::string(TRAINER_BIN) + " inspect " + (dir / "run/ckpt/step_00000020").string(), &out) != 0);
  out.clear();
  const int rc = run(std::string(TRAINER_BIN) + " --config " + cfg + " --stop-after 25", &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK_THAT(out, Catch::Contains("rank_00000.safetensors") && Catch::Contains("step_00000020"));
  CHECK_THAT(out, Catch::Contains("resumed from") && Catch::Contains("step_00000010"));
  // The resumed run saved a good step_00000020 again; damage it once more. An
  // explicit path to a damaged checkpoint is an error, not a silent fresh start.
  flip_middle_byte(shard);
  out.clear();
  CHECK(run(std::string(TRAINER_BIN) + " --config " + cfg + " --resume " +
                (dir / "run/ckpt/step_00000020").string(),
            &out) == 1);
  CHECK_THAT(out, Catch::Contains("rank_00000.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("smoke test passes on a healthy config and fails on a diverging one", "[smoke][e2e][serial]") {
  const fs::path dir = fresh_dir("smoke");
  const std::string tokens = make_tokens(dir);
  const std::string cfg = write_config(dir, tokens, "");
  std::string out;
  int rc = run(std::string(TRAINER_BIN) + " --config " + cfg + " --smoke-test --steps 40", &out);
  {
    INFO(out);
    CHECK(rc == 0);
    CHECK_THAT(out, Catch::Contains("smoke test PASSED"));
    CHECK_THAT(out, Catch::Contains("PASS  checkpoint save -> load round trip"));
  }
  out.clear();
  rc = run(std::string(TRAINER_BIN) + " --config " + cfg +
               " --set optim.lr=20 --set optim.warmup_steps=0 --set train.grad_clip=0 --smoke-test --steps 40",
           &out);
  INFO(out);
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("smoke test FAILED"));
  CHECK((out.find("FAIL  loss falling") != std::string::npos ||
         out.find("FAIL  no NaN/Inf") != std::string::npos));
  fs::remove_all(dir);
}
