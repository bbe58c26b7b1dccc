// log.trace: the merged Chrome trace of a 4-rank run (pp2 x dp2, ZeRO-1)
// against the run's own time table (ranks.jsonl, metrics.jsonl): every rank
// has its process row, the spans of each thread nest, and the spans' own
// time per category adds up to what the time table says of the same steps.
// And `trainer schedule --trace` writes the simulated pipeline the same way.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e_util.h"
#include "tests/build_paths.h"

namespace fs = std::filesystem;
using namespace trainer;
using nlohmann::json;

namespace {

struct Span {
  double ts, dur;
  std::string cat, name;
};

json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return json::parse(in);
}

// Per (pid, tid): the complete spans, by start (the longer first at a tie).
std::map<std::pair<int, int>, std::vector<Span>> spans_by_thread(const json& trace) {
  std::map<std::pair<int, int>, std::vector<Span>> out;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X")
      out[{e["pid"].get<int>(), e["tid"].get<int>()}].push_back(
          {e["ts"].get<double>(), e["dur"].get<double>(), e["cat"].get<std::string>(), e["name"].get<std::string>()});
  for (auto& [k, v] : out)
    std::sort(v.begin(), v.end(), [](const Span& a, const Span& b) { return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur; });
  return out;
}

// Checks that the spans of one thread nest and returns each category's own
// time (a span's duration less its children's), in milliseconds; the
// self-time of the "wait" spans is also kept per group label (the last word
// of their names: "wait all_reduce dp").
struct SelfTimes {
  std::map<std::string, double> by_cat, wait_by_group;
  std::string nesting_error;
};

// The log window's reports (category "log") lie outside the time table,
// so everything inside one counts as "log" too.
SelfTimes self_times(const std::vector<Span>& spans) {
  SelfTimes out;
  std::vector<size_t> stack;
  std::vector<double> child(spans.size(), 0);
  std::vector<std::string> cat(spans.size());
  constexpr double kSlackUs = 0.002;  // the file's ts and dur have 3 decimals of a microsecond
  for (size_t i = 0; i < spans.size(); ++i) {
    while (!stack.empty() && spans[stack.back()].ts + spans[stack.back()].dur <= spans[i].ts + kSlackUs) stack.pop_back();
    if (!stack.empty()) {
      const Span& p = spans[stack.back()];
      if (spans[i].ts + spans[i].dur > p.ts + p.dur + kSlackUs && out.nesting_error.empty())
        out.nesting_error = "'" + spans[i].name + "' at " + std::to_string(spans[i].ts) + " us overlaps its parent '" +
                            p.name + "' without nesting";
      child[stack.back()] += spans[i].dur;
    }
    cat[i] = !stack.empty() && cat[stack.back()] == "log" ? "log" : spans[i].cat;
    stack.push_back(i);
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const double self_ms = (spans[i].dur - child[i]) * 1e-3;
    out.by_cat[cat[i]] += self_ms;
    if (cat[i] == "wait") out.wait_by_group[spans[i].name.substr(spans[i].name.rfind(' ') + 1)] += self_ms;
  }
  return out;
}

// The trace's figure against the table's for the same steps: within 5%, or
// 0.05 ms a step where a part is that small (the timers' own granularity).
void expect_close(const std::string& what, double traced, double table, int steps) {
  const double tol = std::max(0.05 * std::abs(table), 0.05 * steps);
  std::printf("[trace] %-34s trace %9.3f ms, time table %9.3f ms, diff %.3f (tol %.3f)\n", what.c_str(), traced, table,
              traced - table, tol);
  CHECK(std::abs(traced - table) <= tol);
}

}  // namespace

TEST_CASE("log.trace: one trace of every rank, its spans nest and add up to the time table", "[trace][e2e]") {
  const e2e::Setup s = e2e::make_setup_config(
      "trace", "pp2dp2",
      "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}",
      "steps: 6, seq_len: 32, micro_batch_size: 2, global_batch_size: 8");
  const std::string rd = (s.dir / "run").string();
  std::string out;
  const int rc = e2e::run_by_hand(s.cfg, 4, rd, &out,
                                  "--set parallel.pp=2 --set parallel.zero_stage=1 --set log.trace=3-5");
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  CHECK(out.find("trace: steps 3-5 of 4 ranks -> " + rd + "/trace.json") != std::string::npos);
  const json trace = read_json(fs::path(rd) / "trace.json");
  constexpr int kSteps = 3;

  // One process row per rank, each with its compute thread.
  std::map<int, std::string> process;
  std::map<std::pair<int, int>, std::string> thread;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") process[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    if (e["name"] == "thread_name") thread[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
  }
  REQUIRE(process.size() == 4);
  for (int r = 0; r < 4; ++r) REQUIRE(process[r].rfind("rank " + std::to_string(r), 0) == 0);

  // Clocks: all ranks share this host's steady clock, so each measured
  // offset must lie within its own stated uncertainty (half its round trip).
  const json& other = trace["otherData"];
  REQUIRE(other["clock_offset_ms"].size() == 4);
  for (size_t r = 0; r < 4; ++r) {
    const double off = other["clock_offset_ms"][r], rtt = other["clock_round_trip_ms"][r];
    std::printf("[trace] rank %zu clock offset %.4f ms, round trip %.4f ms\n", r, off, rtt);
    CHECK(std::abs(off) <= rtt / 2 + 0.002);
  }

  // Sends and receives are async spans on the pp track, each begun and ended.
  std::map<std::string, int> async_open;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "b") ++async_open[e["id"].get<std::string>()];
    if (e["ph"] == "e") --async_open[e["id"].get<std::string>()];
  }
  CHECK(async_open.size() > 0);
  for (const auto& [id, n] : async_open) CHECK(n == 0);

  // The time table of the same steps: every rank's ranks.jsonl rows.
  std::map<int, std::map<std::string, double>> table;
  {
    std::ifstream in(fs::path(rd) / "ranks.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j["step"] < 3 || j["step"] > 5) continue;
      for (const char* k : {"data_ms", "forward_ms", "backward_ms", "optimizer_ms", "comm_ms", "step_ms"})
        table[j["rank"].get<int>()][k] += j[k].get<double>();
    }
  }
  const auto threads = spans_by_thread(trace);
  int stages_with_embedding = 0;
  for (int r = 0; r < 4; ++r) {
    int compute_tid = -1;
    for (const auto& [k, name] : thread)
      if (k.first == r && name == "compute") compute_tid = k.second;
    REQUIRE(compute_tid > 0);
    for (const auto& [k, spans] : threads) {
      if (k.first != r) continue;
      const SelfTimes t = self_times(spans);
      INFO("rank " << r << " thread " << thread[k]);
      CHECK(t.nesting_error == "");
    }
    const std::vector<Span>& compute = threads.at({r, compute_tid});
    const SelfTimes t = self_times(compute);
    int steps = 0;
    double step_total = 0;
    std::map<std::string, int> names;
    for (const Span& sp : compute) {
      names[sp.cat + ": " + sp.name] += 1;
      if (sp.cat == "step") ++steps, step_total += sp.dur * 1e-3;
      if (sp.cat == "log") step_total -= sp.dur * 1e-3;  // outside the table's step
    }
    CHECK(steps == kSteps);
    // Every unit of this rank's stage, per micro-batch, in forward and
    // backward (8 sequences a step in micro-batches of 2 over dp 2: 2 each).
    const bool first_stage = names.count("forward: embedding mb 0") == 1;
    stages_with_embedding += first_stage;
    for (const std::string kind : {"forward", "backward"}) {
      for (int mb = 0; mb < 2; ++mb) {
        const std::string m = " mb " + std::to_string(mb);
        CHECK(names[kind + ": " + (first_stage ? "embedding" : "head") + m] == kSteps);
        for (int l = first_stage ? 0 : 2; l < (first_stage ? 2 : 4); ++l)
          CHECK(names[kind + ": layer " + std::to_string(l) + m] == kSteps);
        CHECK(names[kind + ": " + kind + m] == kSteps);  // the executor's action
      }
    }
    CHECK(names["data: data wait"] == kSteps);
    CHECK(names["optimizer: optimizer"] == 3 * kSteps);  // zeroing, the norm, the update
    const std::string who = "rank " + std::to_string(r) + " ";
    auto& tab = table[r];
    expect_close(who + "forward", t.by_cat.count("forward") ? t.by_cat.at("forward") : 0, tab["forward_ms"], kSteps);
    expect_close(who + "backward", t.by_cat.count("backward") ? t.by_cat.at("backward") : 0, tab["backward_ms"], kSteps);
    expect_close(who + "optimizer", t.by_cat.count("optimizer") ? t.by_cat.at("optimizer") : 0, tab["optimizer_ms"],
                 kSteps);
    expect_close(who + "data wait", t.by_cat.count("data") ? t.by_cat.at("data") : 0, tab["data_ms"], kSteps);
    expect_close(who + "exposed communication", t.by_cat.count("wait") ? t.by_cat.at("wait") : 0, tab["comm_ms"],
                 kSteps);
    expect_close(who + "step", step_total, tab["step_ms"], kSteps);
  }

  CHECK(stages_with_embedding == 2);  // pp 2 x dp 2: two ranks per stage

  // Rank 0 per group, against metrics.jsonl: exposed per group, and the dp
  // group's busy time against its comm track (the runs on Gloo's worker).
  std::map<std::string, double> exposed, busy;
  {
    std::ifstream in(fs::path(rd) / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (!j.contains("time_ms") || j["step"] < 3 || j["step"] > 5) continue;
      for (const auto& [k, v] : j["time_ms"].items())
        if (k.rfind("comm_", 0) == 0) exposed[k.substr(5)] += v.get<double>();
      for (const auto& [k, v] : j["comm_busy_ms"].items()) busy[k] += v.get<double>();
    }
  }
  int compute0 = -1, dp_track = -1;
  for (const auto& [k, name] : thread) {
    if (k.first != 0) continue;
    if (name == "compute") compute0 = k.second;
    if (name == "comm dp_cp") dp_track = k.second;
  }
  REQUIRE(dp_track > 0);
  const SelfTimes t0 = self_times(threads.at({0, compute0}));
  REQUIRE(exposed.count("dp_cp") == 1);
  for (const auto& [g, ms] : exposed)
    expect_close("rank 0 exposed " + g, t0.wait_by_group.count(g) ? t0.wait_by_group.at(g) : 0, ms, kSteps);
  double dp_run = 0;
  for (const Span& sp : threads.at({0, dp_track})) dp_run += sp.dur * 1e-3;
  expect_close("rank 0 dp_cp busy (its comm track)", dp_run, busy["dp_cp"], kSteps);
  fs::remove_all(s.dir);
}

TEST_CASE("trainer schedule --trace: the simulated pipeline, one row per stage", "[trace]") {
  const e2e::Setup s = e2e::make_setup_config(
      "trace", "schedule",
      "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, max_seq_len: 32}",
      "steps: 6, seq_len: 32, micro_batch_size: 2, global_batch_size: 8");
  const fs::path path = s.dir / "simulated.json";
  std::string out;
  const int rc = e2e::run(std::string(TRAINER_BIN) + " schedule --config " + s.cfg +
                              " --set parallel.pp=4 --set parallel.pp_schedule=1f1b --world 4 --trace " +
                              path.string() + " --forward-ms 2.5",
                          &out);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("-> " + path.string()) != std::string::npos);
  const json trace = read_json(path);
  CHECK(trace["otherData"]["simulated"] == true);
  std::map<int, int> forwards, backwards;
  double longest_forward = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    (e["cat"] == "forward" ? forwards : backwards)[e["pid"].get<int>()] += 1;
    if (e["cat"] == "forward") longest_forward = std::max(longest_forward, e["dur"].get<double>());
  }
  // 8 sequences in micro-batches of 2 on one replica: 4 micro-batches per stage.
  for (int st = 0; st < 4; ++st) {
    CHECK(forwards[st] == 4);
    CHECK(backwards[st] == 4);
  }
  CHECK(longest_forward == Approx(2500.0).epsilon(1e-6));  // microseconds
  fs::remove_all(s.dir);
}
