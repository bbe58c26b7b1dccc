// Running for weeks (issue 14), through the real binary: a NaN on one rank
// skips the step on every rank (the weights equal a run whose step is
// skipped without a NaN, bit for bit), rollback goes back to the newest
// checkpoint, stop exits 4 naming the step and the parameter; SIGTERM to
// one rank saves at a step all ranks agree on and exits 75, and the
// relaunch ends bit for bit where the uninterrupted run ends; a second
// signal exits at once and the newest checkpoint stays loadable; a rank
// killed at a random step under torchrun with restarts, 10 trials, each
// ends bit for bit on the uninterrupted run; a rank slowed on purpose is
// named by the straggler alert, and nobody is without the delay; the time
// breakdown's named parts explain the step. Faults come from the test-only
// TRAINER_TEST_HOOKS (train/test_hooks.h).
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "train/preemption.h"
#include "train/step_policy.h"

namespace fs = std::filesystem;
using namespace trainer;
using e2e::run;
using e2e::Setup;

namespace {

const char* const kLlama =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A torchrun launch of `world` ranks (with --max_restarts), returning its exit code.
int torchrun(const Setup& s, int world, const std::string& run_dir, const std::string& extra, std::string* out,
             int restarts = 0, const std::string& env = "") {
  return run(env + " torchrun -r 1 -t 2 --log_dir " + run_dir + ".tlog --max_restarts " + std::to_string(restarts) +
                 " --nproc_per_node " + std::to_string(world) + " --master_port " + std::to_string(e2e::free_port()) +
                 " --no_python " + TRAINER_BIN + " --config " + s.cfg + " --set run.dir=" + run_dir + " " + extra,
             out);
}

}  // namespace

TEST_CASE("step policy: NaN/Inf and loss spikes flagged, skip / rollback / stop after the limit", "[ops][policy]") {
  TrainConfig t;
  t.spike_zscore = 6;
  t.spike_window = 20;
  t.nonfinite_limit = 2;
  StepPolicy p(t);
  std::mt19937 g(3);
  std::normal_distribution<double> noise(0, 0.01);
  for (int i = 0; i < 30; ++i) CHECK(p.judge(3.0 + noise(g), 1.0).flag == StepFlag::Healthy);
  const StepVerdict spike = p.judge(4.5e9, 1e20);
  std::printf("[policy] %s\n", spike.why.c_str());
  CHECK(spike.flag == StepFlag::Spike);
  CHECK(spike.action == StepAction::Skip);
  CHECK(p.judge(std::nan(""), 1.0).action == StepAction::Skip);                         // 2 in a row
  CHECK(p.judge(1.0, std::numeric_limits<double>::infinity()).action == StepAction::Stop);  // 3 > limit
  // A falling loss is no spike; a healthy step resets the count.
  StepPolicy q(t);
  for (int i = 0; i < 60; ++i) CHECK(q.judge(6.0 - 0.05 * i, 1.0).flag == StepFlag::Healthy);
  t.nonfinite = "rollback";
  t.nonfinite_limit = 0;
  StepPolicy r(t);
  CHECK(r.judge(std::nan(""), 1.0).action == StepAction::Rollback);
  t.nonfinite = "stop";
  StepPolicy s(t);
  CHECK(s.judge(1.0, std::nan("")).action == StepAction::Stop);
}

TEST_CASE("step policy: a slow exponential blow-up is flagged before the loss passes its ceiling", "[ops][policy]") {
  // 60 healthy steps, then loss and gradient norm grow 3% a step: a mean and
  // standard deviation over the window follow them up; the ceiling
  // (3 ln 256 = 16.6) and the median-based z-score do not.
  TrainConfig t;
  StepPolicy p(t, 256);
  std::mt19937 g(5);
  std::normal_distribution<double> noise(0, 0.3);
  for (int i = 0; i < 60; ++i) REQUIRE(p.judge(5.0 + noise(g), 1.0 + 0.1 * noise(g)).flag == StepFlag::Healthy);
  double loss = 5.0, norm = 1.0;
  StepVerdict v;
  int k = 0;
  for (; k < 200; ++k) {
    loss *= 1.03;
    norm *= 1.03;
    v = p.judge(loss, norm);
    if (v.flag != StepFlag::Healthy) break;
  }
  std::printf("[policy] 3%%/step blow-up from 5.0: flagged after %d steps at loss %.3g, norm %.3g: %s\n", k + 1,
              loss, norm, v.why.c_str());
  CHECK(v.flag != StepFlag::Healthy);
  CHECK(loss <= 3 * std::log(256.0) * 1.03);
  // From the first step on, with no history: the ceilings.
  StepPolicy q(t, 256);
  CHECK(q.judge(1.7e13, 4e32).flag == StepFlag::Ceiling);
  StepPolicy r(t, 256);
  CHECK(r.judge(5.5, 2e4).flag == StepFlag::Ceiling);  // train.grad_norm_ceiling 1e4
  CHECK(r.judge(5.5, 3.0).flag == StepFlag::Healthy);
  // Ceilings off: a loss of 1e3 at the first step passes (nothing to compare with).
  t.loss_ceiling = -1;
  t.grad_norm_ceiling = 0;
  StepPolicy off(t, 256);
  CHECK(off.judge(1e3, 1e5).flag == StepFlag::Healthy);
}

namespace {
// The loss the run printed for `step` (its progress or log line), or NaN.
double printed_loss(const std::string& out, int64_t step) {
  const std::string key = "step " + std::to_string(step) + "/";
  for (size_t k = out.find("step "); k != std::string::npos; k = out.find("step ", k + 1)) {
    size_t j = k + 5;
    while (j < out.size() && out[j] == ' ') ++j;
    if (out.compare(j, key.size() - 5, key.substr(5)) != 0) continue;
    const size_t l = out.find("| loss ", j);
    if (l == std::string::npos) break;
    return std::strtod(out.c_str() + l + 7, nullptr);
  }
  return std::nan("");
}
}  // namespace

TEST_CASE("a huge learning rate never leaves an exploded checkpoint (lr 1e6 and lr 50)", "[ops][policy][e2e]") {
  // Saves are due at every step, the worst case: an update can explode the
  // weights while its own step looked fine, so a snapshot is only written
  // once the next step has run healthy on it. Every checkpoint left must
  // resume to a sane loss (below the ceiling 3 ln 256 = 16.6).
  const Setup s = e2e::make_setup("ops", "huge_lr", kLlama);
  for (const char* lr : {"1e6", "50"}) {
    const std::string dir = (s.dir / (std::string("lr") + lr)).string();
    std::string out;
    std::vector<int> codes;
    e2e::run_by_hand(s.cfg, 1, dir, &out,
                     std::string("--set optim.lr=") + lr +
                         " --set optim.warmup_steps=0 --set train.grad_clip=0 --set checkpoint.interval=1 "
                         "--set checkpoint.keep_last=100 --set log.interval=1",
                     &codes);
    INFO("lr " << lr << ": " << e2e::tail(out));
    REQUIRE(codes.size() == 1);
    CHECK((codes[0] == 0 || codes[0] == kStoppedByPolicyExitCode));
    int checked = 0;
    const fs::path root = fs::path(dir) / "ckpt";
    for (const auto& e : fs::exists(root) ? fs::directory_iterator(root) : fs::directory_iterator()) {
      const std::string name = e.path().filename().string();
      if (name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos) continue;
      const int64_t step = std::stoll(name.substr(5));
      if (step >= 20) continue;  // the last step's save is the run's end, judged by that step
      std::string again;
      const std::string resumed = dir + "_from_" + name;
      e2e::run_by_hand(s.cfg, 1, resumed, &again,
                       "--set checkpoint.resume=" + e.path().string() + " --set optim.lr=1e-4 --set train.steps=" +
                           std::to_string(step + 1) + " --set checkpoint.interval=0 --set log.interval=1");
      const double l = printed_loss(again, step + 1);
      std::printf("[policy] lr %s: %s resumes at loss %.4g\n", lr, name.c_str(), l);
      CHECK(std::isfinite(l));
      CHECK(l < 3 * std::log(256.0));
      ++checked;
    }
    std::printf("[policy] lr %s: exit %d, %d checkpoints before the last step, every one sane\n", lr, codes[0], checked);
  }
  fs::remove_all(s.dir);
}

TEST_CASE("a NaN in one rank's gradient skips the step on every rank, rollback and stop", "[ops][policy][e2e]") {
  const Setup s = e2e::make_setup("ops", "nan", kLlama);
  std::string out;
  // dp 2 at ZeRO-1: rank 1's gradient of step 7 gets a NaN before its reduction.
  const std::string nan = (s.dir / "nan").string(), ref = (s.dir / "skipped").string();
  setenv("TRAINER_TEST_HOOKS", "nan_grad=1:7", 1);
  out.clear();
  const int a = e2e::run_by_hand(s.cfg, 2, nan, &out, "--set parallel.zero_stage=1");
  INFO(e2e::tail(out));
  REQUIRE(a == 0);
  CHECK(out.find("step 7: loss") != std::string::npos);
  CHECK(out.find("gradient norm nan; first non-finite gradient: ") != std::string::npos);
  CHECK(out.find("update skipped on every rank") != std::string::npos);
  setenv("TRAINER_TEST_HOOKS", "skip=*:7", 1);
  out.clear();
  REQUIRE(e2e::run_by_hand(s.cfg, 2, ref, &out, "--set parallel.zero_stage=1") == 0);
  const double w = e2e::weight_diff(fs::path(nan) / "ckpt/step_00000020", fs::path(ref) / "ckpt/step_00000020");
  std::printf("[policy] NaN on rank 1 at step 7 vs step 7 skipped without one: final weights differ by %.3g "
              "(required: 0, bit for bit)\n", w);
  CHECK(w == 0);

  // stop: exit 4 naming the step and the parameter.
  setenv("TRAINER_TEST_HOOKS", "nan_grad=0:5", 1);
  out.clear();
  std::vector<int> codes;
  e2e::run_by_hand(s.cfg, 2, (s.dir / "stop").string(), &out, "--set train.nonfinite=stop", &codes);
  INFO(e2e::tail(out));
  CHECK(codes == std::vector<int>{kStoppedByPolicyExitCode, kStoppedByPolicyExitCode});
  CHECK(out.find("error: step 5: loss") != std::string::npos);
  CHECK(out.find("first non-finite gradient: ") != std::string::npos);

  // rollback at the first flagged step (limit 0): back to step 5, data of steps 6-7 skipped.
  setenv("TRAINER_TEST_HOOKS", "nan_grad=0:7", 1);
  out.clear();
  const std::string rb = (s.dir / "rollback").string();
  const int c = e2e::run_by_hand(s.cfg, 2, rb, &out,
                                 "--set train.nonfinite=rollback --set train.nonfinite_limit=0 --set checkpoint.interval=5");
  unsetenv("TRAINER_TEST_HOOKS");
  INFO(e2e::tail(out));
  REQUIRE(c == 0);
  CHECK(out.find("rolled back to " + rb + "/ckpt/step_00000005 (step 5); the data of steps 6-7 is skipped") !=
        std::string::npos);
  CHECK(read_file(fs::path(rb) / "ckpt/step_00000020/manifest.json").find("\"data_offset\": 2") != std::string::npos);
  // metrics.jsonl after the rollback: the rows past step 5 were trimmed
  // under the open log, which goes on at the file's new end (no hole of NUL
  // bytes), each step's loss row once and in order.
  const std::string metrics = read_file(fs::path(rb) / "metrics.jsonl");
  REQUIRE(!metrics.empty());
  CHECK(metrics.find('\0') == std::string::npos);
  std::vector<long long> loss_steps;
  std::istringstream rows(metrics);
  for (std::string row; std::getline(rows, row);)
    if (row.find("\"loss\": ") != std::string::npos && row.find("\"step\": ") != std::string::npos)
      loss_steps.push_back(std::stoll(row.substr(row.find("\"step\": ") + 8)));
  std::string listed;
  for (long long v : loss_steps) listed += std::to_string(v) + " ";
  INFO("loss rows at steps " << listed);
  REQUIRE(!loss_steps.empty());
  CHECK(std::is_sorted(loss_steps.begin(), loss_steps.end()));
  CHECK(std::adjacent_find(loss_steps.begin(), loss_steps.end()) == loss_steps.end());
  CHECK(loss_steps.back() == 20);
  fs::remove_all(s.dir);
}

TEST_CASE("a NaN in the gradient of any rank of tp2 x pp2 x dp2 flags its step on every rank", "[ops][policy][e2e]") {
  // Rank r's gradient gets a NaN at step 2 + 2r (every other step, so no two
  // flagged steps are in a row): tensor-parallel replicas of a piece (norm
  // weights, biases) that the gradient norm counts once must be looked at
  // on every rank, or the update is applied and the run dies a step later.
  const Setup s = e2e::make_setup("ops", "nan_every_rank", kLlama);
  std::string hooks;
  for (int r = 0; r < 8; ++r) hooks += (r ? "," : "") + std::string("nan_grad=") + std::to_string(r) + ":" + std::to_string(2 + 2 * r);
  setenv("TRAINER_TEST_HOOKS", hooks.c_str(), 1);
  std::string out;
  const int c = e2e::run_by_hand(s.cfg, 8, (s.dir / "run").string(), &out,
                                 "--set parallel.tp=2 --set parallel.pp=2 --set train.nonfinite=skip");
  unsetenv("TRAINER_TEST_HOOKS");
  INFO(e2e::tail(out));
  REQUIRE(c == 0);
  for (int r = 0; r < 8; ++r) {
    const std::string step = std::to_string(2 + 2 * r);
    INFO("rank " << r << ", step " << step);
    CHECK(out.find("step " + step + ": loss") != std::string::npos);
  }
  size_t skipped = 0;
  for (size_t k = out.find("update skipped on every rank"); k != std::string::npos;
       k = out.find("update skipped on every rank", k + 1))
    ++skipped;
  std::printf("[policy] NaN injected on each of 8 ranks (tp2 x pp2 x dp2) at its own step: %zu of 8 steps flagged\n",
              skipped);
  CHECK(skipped == 8);
  CHECK(out.find("training diverged") == std::string::npos);
  fs::remove_all(s.dir);
}

TEST_CASE("a NaN on the last step exits 4 on every rank naming the newest checkpoint", "[ops][policy][e2e]") {
  const Setup s = e2e::make_setup("ops", "nan_last", kLlama);
  setenv("TRAINER_TEST_HOOKS", "nan_grad=1:20", 1);
  std::string out;
  std::vector<int> codes;
  const std::string dir = (s.dir / "run").string();
  e2e::run_by_hand(s.cfg, 2, dir, &out, "--set checkpoint.interval=5", &codes);
  unsetenv("TRAINER_TEST_HOOKS");
  INFO(e2e::tail(out));
  CHECK(codes == std::vector<int>{kStoppedByPolicyExitCode, kStoppedByPolicyExitCode});
  CHECK(out.find("the last step was flagged (step 20: loss") != std::string::npos);
  CHECK(out.find("the newest checkpoint is " + dir + "/ckpt/step_00000015") != std::string::npos);
  CHECK(!fs::exists(fs::path(dir) / "ckpt/step_00000020"));
  fs::remove_all(s.dir);
}

TEST_CASE("SIGTERM to one rank: every rank saves the same step, exits 75, the relaunch ends bit for bit",
          "[ops][preemption][e2e]") {
  const Setup s = e2e::make_setup("ops", "sigterm", kLlama);
  const std::string set = "--set checkpoint.resume=auto --set parallel.zero_stage=1";
  std::string out;
  const std::string straight = (s.dir / "straight").string(), cut = (s.dir / "cut").string();
  REQUIRE(torchrun(s, 2, straight, set, &out) == 0);
  out.clear();
  const int first = torchrun(s, 2, cut, set, &out, 0, "TRAINER_TEST_HOOKS=signal=1:8");
  INFO(e2e::tail(out));
  CHECK(first != 0);  // torchrun reports the workers' 75
  CHECK(out.find("exitcode  : 75") != std::string::npos);
  CHECK(fs::exists(fs::path(cut) / "ckpt/step_00000008/manifest.json"));
  CHECK(!fs::exists(fs::path(cut) / "ckpt/step_00000009"));
  out.clear();
  REQUIRE(torchrun(s, 2, cut, set, &out) == 0);
  const double w = e2e::weight_diff(fs::path(straight) / "ckpt/step_00000020", fs::path(cut) / "ckpt/step_00000020");
  std::printf("[preemption] SIGTERM on rank 1 at step 8, saved at step 8, relaunched: final weights differ by %.3g "
              "(required: 0)\n", w);
  CHECK(w == 0);

  // A second signal exits at once; the newest complete checkpoint stays loadable.
  const std::string twice = (s.dir / "twice").string();
  const std::string log = twice + ".log";
  const int rc = run("(" + std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + twice +
                         " --set train.steps=100000 --set checkpoint.interval=50 --set optim.warmup_steps=1 > " + log +
                         " 2>&1 & pid=$!; while ! grep -q 'checkpoint: .*step_00000100' " + log +
                         " 2>/dev/null; do sleep 0.05; done; kill -TERM $pid; kill -TERM $pid; wait $pid)",
                     &out);
  std::printf("[preemption] two SIGTERMs: exit %d\n", rc);
  CHECK(rc == kPreemptedExitCode);
  out.clear();
  std::string newest = read_file(fs::path(twice) / "ckpt/latest");
  while (!newest.empty() && (newest.back() == '\n' || newest.back() == ' ')) newest.pop_back();
  INFO("latest: " << newest);
  REQUIRE(!newest.empty());
  CHECK(run(std::string(TRAINER_BIN) + " inspect " + twice + "/ckpt/" + newest, &out) == 0);
  CHECK(out.find("status: CORRUPT") == std::string::npos);
  fs::remove_all(s.dir);
}

TEST_CASE("a rank killed while it writes an async checkpoint: its peers stop waiting within seconds, naming it",
          "[ops][restart][e2e]") {
  const Setup s = e2e::make_setup("ops", "killsave", kLlama);
  // Saves every 5 steps in the background; rank 1 is killed with its file of
  // step 10 written and its report not sent. timeout_s 120 bounds a failure:
  // before peers were watched, rank 0 waited all of it for the report.
  const std::string set = "--set checkpoint.interval=5 --set checkpoint.async=true --set parallel.timeout_s=120";
  const double bound_s = 60;  // half the timeout: far above the few seconds heartbeats need
  std::string out;
  setenv("TRAINER_TEST_HOOKS", "kill_in_save=1:10", 1);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int> codes;
  e2e::run_by_hand(s.cfg, 2, (s.dir / "by_hand").string(), &out, set, &codes);
  const double by_hand_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("TRAINER_TEST_HOOKS");
  {
    INFO(e2e::tail(out));
    std::printf("[liveness] rank 1 killed in the save of step 10 (2 ranks by hand): exits %d %d after %.1f s "
                "(bound %.0f s, parallel.timeout_s 120)\n", codes[0], codes[1], by_hand_s, bound_s);
    CHECK(codes[1] == 128 + SIGKILL);
    CHECK(codes[0] != 0);
    CHECK(by_hand_s < bound_s);
    // Rank 0 names rank 1 and its node: the save's wait, or the
    // collective's heartbeat summary.
    CHECK((out.find("rank 1 is gone (rank 1 on node ") != std::string::npos ||
           out.find("rank 1 last at step") != std::string::npos));
    CHECK(!fs::exists(s.dir / "by_hand/ckpt/step_00000010"));
    CHECK(fs::exists(s.dir / "by_hand/ckpt/step_00000005/manifest.json"));
  }
  // Under torchrun, which SIGTERMs the survivors when a worker dies and
  // SIGKILLs them only 30 s later: the job ends well before that.
  out.clear();
  t0 = std::chrono::steady_clock::now();
  const int rc = torchrun(s, 2, (s.dir / "torchrun").string(), set, &out, 0, "TRAINER_TEST_HOOKS=kill_in_save=1:10");
  const double torchrun_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(e2e::tail(out));
  std::printf("[liveness] the same under torchrun: exit %d after %.1f s (bound 25 s: torchrun's SIGKILL comes at 30)\n",
              rc, torchrun_s);
  CHECK(rc != 0);
  CHECK(torchrun_s < 25);
  fs::remove_all(s.dir);
}

TEST_CASE("a rank killed at a random step under torchrun with restarts: 10 trials end bit for bit", "[ops][restart][e2e]") {
  const Setup s = e2e::make_setup("ops", "kill", kLlama);
  const std::string set = "--set checkpoint.resume=auto --set checkpoint.interval=3 --set parallel.timeout_s=20";
  std::string out;
  const std::string straight = (s.dir / "straight").string();
  REQUIRE(torchrun(s, 2, straight, set, &out) == 0);
  std::mt19937 g(uint32_t(::getpid()));
  int equal = 0;
  for (int trial = 0; trial < 10; ++trial) {
    const int rank = int(g() % 2), step = 2 + int(g() % 17);
    const std::string rd = (s.dir / ("trial" + std::to_string(trial))).string();
    out.clear();
    const int rc = torchrun(s, 2, rd, set, &out, 3,
                            "TRAINER_TEST_HOOKS=kill=" + std::to_string(rank) + ":" + std::to_string(step));
    INFO("trial " << trial << ": rank " << rank << " killed at step " << step << "\n" << out);
    REQUIRE(rc == 0);
    // torchrun's log directory holds one attempt per launch: the kill made a second.
    bool restarted = false;
    for (const auto& e : fs::recursive_directory_iterator(rd + ".tlog")) restarted |= e.path().filename() == "attempt_1";
    CHECK(restarted);
    const double w = e2e::weight_diff(fs::path(straight) / "ckpt/step_00000020", fs::path(rd) / "ckpt/step_00000020");
    std::printf("[restart] trial %d: rank %d SIGKILLed at step %d, torchrun restarted (%s), final weights differ by "
                "%.3g\n", trial, rank, step, restarted ? "attempt_1 seen" : "NO restart seen", w);
    equal += w == 0 && restarted;
    fs::remove_all(rd);
    fs::remove_all(rd + ".tlog");
  }
  std::printf("[restart] %d of 10 trials bit for bit equal to the uninterrupted run (required: 10)\n", equal);
  CHECK(equal == 10);
  fs::remove_all(s.dir);
}

namespace {

// Four ranks of `cfg` on this host, the rank `stopped` (-1: none) SIGSTOPped
// for stop_ms of every 100 ms while it runs (a noisy neighbour, a swapping
// host); returns rank 0's output.
std::string four_ranks(const Setup& s, const std::string& run_dir, int stopped, int stop_ms, const std::string& set) {
  const int port = e2e::free_port();
  std::string cmd = "(pids=''; ";
  for (int r = 0; r < 4; ++r)
    cmd += "RANK=" + std::to_string(r) + " WORLD_SIZE=4 LOCAL_RANK=" + std::to_string(r) +
           " LOCAL_WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port - 1) + " " + TRAINER_BIN +
           " --config " + s.cfg + " --set run.dir=" + run_dir + " " + set + " > " + run_dir + ".rank" +
           std::to_string(r) + ".log 2>&1 & pids=\"$pids $!\"; ";
  if (stopped >= 0) {
    const std::string stop = std::to_string(stop_ms / 1000.0), go = std::to_string((100 - stop_ms) / 1000.0);
    cmd += "victim=$(echo $pids | cut -d' ' -f" + std::to_string(stopped + 1) +
           "); (while kill -STOP $victim 2>/dev/null; do sleep " + stop + "; kill -CONT $victim; sleep " + go +
           "; done) & ";
  }
  cmd += "for p in $pids; do wait $p || exit 1; done)";
  std::string out;
  const int rc = run(cmd, &out);
  out += read_file(run_dir + ".rank0.log");
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  return out;
}

}  // namespace

TEST_CASE("the straggler alert names a rank stopped half the time among 4, and no rank of 3 clean runs",
          "[ops][monitor][e2e][serial]") {
  const Setup s = e2e::make_setup("ops", "stopped", kLlama);
  // A step that computes more than it communicates (one thread per rank,
  // four ranks on the host's cores); alert at 20% of the step (the default)
  // averaged over 3 log intervals. Measured on 2 cores: a rank stopped half
  // the time held the others 22-39% of the step in 11 runs (stops that land
  // inside a collective delay every member alike and are nobody's); a clean
  // rank 0, which also writes the logs, averaged up to 15%, so a 40% stop
  // judged at 15% was too close to call.
  // Before the alert named the rank the others wait for, a stopped rank
  // showed only +5-15% in its own busy time, and a loaded host raised false
  // alerts on the busy time's noise.
  const std::string set =
      "--set model.d_model=128 --set model.n_layers=4 --set model.d_ff=256 --set model.max_seq_len=64 "
      "--set train.seq_len=64 --set train.micro_batch_size=4 --set train.global_batch_size=16 --set train.threads=1 "
      "--set train.steps=40 --set train.eval_interval=0 --set log.interval=5 --set checkpoint.interval=0 "
      "--set log.straggler_threshold=0.2";
  for (int run_no = 0; run_no < 3; ++run_no) {
    const std::string out = four_ranks(s, (s.dir / ("clean" + std::to_string(run_no))).string(), -1, 0, set);
    std::printf("[monitor] clean 4-rank run %d: %s\n", run_no,
                out.find("straggler:") == std::string::npos ? "no alert" : "ALERT");
    CHECK(out.find("straggler:") == std::string::npos);
  }
  const std::string stopped = (s.dir / "stopped").string();
  const std::string out = four_ranks(s, stopped, 2, 50, set);
  {
    // What the alert judged: each rank's held_others_ms per log step.
    std::istringstream rows(read_file(fs::path(stopped) / "ranks.jsonl"));
    std::string table;
    for (std::string row; std::getline(rows, row);) {
      auto field = [&](const std::string& key) {
        const auto k = row.find("\"" + key + "\": ");
        return k == std::string::npos ? std::string("?") : row.substr(k + key.size() + 4, row.find(',', k) - k - key.size() - 4);
      };
      table += " " + field("step") + "/r" + field("rank") + "=" + field("held_others_ms") + "of" + field("step_ms");
    }
    std::printf("[monitor] rank 2 stopped 50%%: held_others_ms per step/rank:%s\n", table.c_str());
  }
  const auto at = out.find("straggler: rank 2 (host ");
  if (at != std::string::npos) std::printf("[monitor] %s", out.substr(at, out.find('\n', at) - at + 1).c_str());
  INFO(e2e::tail(out));
  CHECK(at != std::string::npos);
  for (const char* other : {"straggler: rank 0", "straggler: rank 1", "straggler: rank 3"})
    CHECK(out.find(other) == std::string::npos);
  CHECK(read_file(fs::path(stopped) / "ranks.jsonl").find("\"held_others_ms\"") != std::string::npos);
  fs::remove_all(s.dir);
}

TEST_CASE("the straggler alert names the slowed rank, and nobody without the delay, the time parts explain the step",
          "[ops][monitor][e2e][serial]") {
  const Setup s = e2e::make_setup("ops", "straggler", kLlama);
  // Two ranks on this 2-core machine (more would share cores and make
  // everybody look slow now and then); rank 1 sleeps 40 ms a step, about 10
  // times its compute: busy 87% above the median of the two.
  // Timing: run alone ([serial]), so that other tests' load does not make
  // a rank look slow.
  const std::string set = "--set log.interval=2 --set log.straggler_intervals=3 --set log.straggler_threshold=0.5";
  std::string out;
  setenv("TRAINER_TEST_HOOKS", "delay=1:40", 1);
  const std::string slow = (s.dir / "slow").string();
  REQUIRE(e2e::run_by_hand(s.cfg, 2, slow, &out, set) == 0);
  unsetenv("TRAINER_TEST_HOOKS");
  {
    INFO(e2e::tail(out));
    const auto at = out.find("straggler: rank 1 (host ");
    CHECK(at != std::string::npos);
    CHECK(out.find("straggler: rank 0") == std::string::npos);
    if (at != std::string::npos) std::printf("[monitor] %s", out.substr(at, out.find('\n', at) - at + 1).c_str());
    // ranks.jsonl: a line per rank and log interval.
    const std::string ranks = read_file(fs::path(slow) / "ranks.jsonl");
    CHECK(ranks.find("\"step\": 20, \"rank\": 1") != std::string::npos);
    CHECK(ranks.find("\"slow_intervals\": 3") != std::string::npos);
    CHECK(ranks.find("\"grad_norm_shard\"") != std::string::npos);
  }
  out.clear();
  const std::string even = (s.dir / "even").string();
  REQUIRE(e2e::run_by_hand(s.cfg, 2, even, &out, set) == 0);
  CHECK(out.find("straggler:") == std::string::npos);

  // One process, a step long enough to time: the named parts (compute, optimizer,
  // data, communication, checkpoint, eval) leave under 5% to "other".
  out.clear();
  const std::string one = (s.dir / "one").string();
  REQUIRE(run(std::string(TRAINER_BIN) + " --config " + s.cfg + " --set run.dir=" + one +
                  " --set log.interval=10 --set model.d_model=128 --set model.d_ff=512 --set train.micro_batch_size=4"
                  " --set train.global_batch_size=16",
              &out) == 0);
  std::ifstream in(fs::path(one) / "metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"time_ms\"") == std::string::npos) continue;
    ++records;
    double total = 0, other = 0;
    std::stringstream ss(line.substr(line.find("\"time_ms\"")));
    for (std::string item; std::getline(ss, item, ',');) {
      const auto colon = item.rfind(':');
      const double v = std::stod(item.substr(colon + 1));
      total += v;
      if (item.find("\"other\"") != std::string::npos) other = v;
    }
    std::printf("[time] %s -> other %.3f of %.3f ms (%.1f%%, required < 5%%)\n", line.c_str(), other, total,
                100 * other / total);
    CHECK(other < 0.05 * total);
  }
  CHECK(records == 2);
  fs::remove_all(s.dir);
}
