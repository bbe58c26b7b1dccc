// parallel.overlap changes when communication happens, never what it
// computes: every layout whose collectives run behind compute (data
// parallel gradient reductions at ZeRO 0-3, ZeRO-3's weight prefetch,
// pipeline sends under 1f1b and zb-h1, the context-parallel ring's next
// key/value block) gives the same losses, gradient
// norms and final weights bit for bit with parallel.overlap false, which
// waits for each collective as soon as it is issued.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// Rank 0's exposed and busy milliseconds of `group` over the run's windows
// (metrics.jsonl time_ms / comm_busy_ms).
std::pair<double, double> exposed_and_busy(const fs::path& metrics, const std::string& group) {
  double exposed = 0, busy = 0;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("time_ms")) continue;
    exposed += j["time_ms"].at("comm_" + group).get<double>();
    busy += j["comm_busy_ms"].at(group).get<double>();
  }
  return {exposed, busy};
}

}  // namespace

TEST_CASE("parallel.overlap on and off give the same run bit for bit", "[overlap][e2e]") {
  const e2e::Setup s = e2e::make_setup("overlap", "overlap", "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 4, "
                                                             "n_heads: 4, n_kv_heads: 2, max_seq_len: 32}");
  struct Layout {
    const char* label;
    int world;
    std::string set;
  };
  const std::vector<Layout> layouts = {
      {"dp2_zero0", 2, "--set parallel.zero_stage=0"},
      {"dp2_zero1", 2, "--set parallel.zero_stage=1"},  // the updated weights' gathers run into the next forward
      {"dp2_zero2", 2, "--set parallel.zero_stage=2"},
      {"dp2_zero3", 2, "--set parallel.zero_stage=3"},
      {"pp2_1f1b", 2, "--set parallel.pp=2 --set parallel.pp_schedule=1f1b"},
      {"pp2_zbh1_dp2_zero1", 4, "--set parallel.pp=2 --set parallel.pp_schedule=zb-h1 --set parallel.zero_stage=1"},
      {"cp2", 2, "--set parallel.cp=2"},
  };
  for (const Layout& l : layouts) {
    std::vector<std::string> dirs;
    for (const char* overlap : {"true", "false"}) {
      const std::string rd = (s.dir / (std::string(l.label) + "_" + overlap)).string();
      std::string out;
      const int rc = e2e::run_by_hand(s.cfg, l.world, rd, &out, l.set + " --set parallel.overlap=" + overlap);
      INFO(l.label << " overlap " << overlap << "\n" << e2e::tail(out));
      REQUIRE(rc == 0);
      dirs.push_back(rd);
    }
    const auto la = e2e::losses(fs::path(dirs[0]) / "metrics.jsonl"), lb = e2e::losses(fs::path(dirs[1]) / "metrics.jsonl");
    const auto ga = e2e::metric(fs::path(dirs[0]) / "metrics.jsonl", "grad_norm"),
               gb = e2e::metric(fs::path(dirs[1]) / "metrics.jsonl", "grad_norm");
    const double w = e2e::weight_diff(fs::path(dirs[0]) / "ckpt/step_00000020", fs::path(dirs[1]) / "ckpt/step_00000020");
    size_t same = 0;
    for (size_t i = 0; i < la.size() && i < lb.size(); ++i) same += la[i] == lb[i];
    std::printf("[overlap] %-20s %zu of %zu losses equal bit for bit, grad norms %s, final weights rel L2 diff %.1e "
                "(required: all equal, 0)\n",
                l.label, same, la.size(), ga == gb ? "equal" : "DIFFER", w);
    // The switch does act: without overlap every collective is waited for
    // as soon as it is issued, so rank 0 is exposed to all of its run.
    const std::string label = l.label;
    const std::string group = label == "cp2" ? "cp" : l.world == 4 || label.rfind("dp", 0) == 0 ? "dp_cp" : "pp";
    const auto [exp_on, busy_on] = exposed_and_busy(fs::path(dirs[0]) / "metrics.jsonl", group);
    const auto [exp_off, busy_off] = exposed_and_busy(fs::path(dirs[1]) / "metrics.jsonl", group);
    std::printf("[overlap] %-20s %s exposed of busy (ms, 20 steps): overlap %.1f of %.1f, none %.1f of %.1f\n",
                l.label, group.c_str(), exp_on, busy_on, exp_off, busy_off);
    INFO(l.label);
    CHECK(busy_off > 0);
    CHECK(exp_off >= 0.9 * busy_off);
    CHECK(la.size() == 20);
    CHECK(la == lb);
    CHECK(ga == gb);
    CHECK(w == 0);
  }
  fs::remove_all(s.dir);
}
