// The short soak (issue 45 item 3; bench/soak.sh is the long one): the tiny
// model for 2,000 steps with a checkpoint every 500 and keep-last rotation,
// an evaluation every 500, TensorBoard on, on one process and on dp2 (the
// rank monitor on). log.resources_interval samples every rank's resident
// memory, open file descriptors and threads and the checkpoints' bytes every
// 100 steps; from step 1000 none may grow: memory by at most 0.25 KiB a step
// (the peaks of steps 1500-1900 against those of 1000-1400),
// descriptors and threads not beyond what the samples of steps 500-1000 held,
// the checkpoints within keep_last + 1 of one checkpoint (the one being
// written beside the kept ones).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

struct Sample {
  int64_t step;
  std::vector<double> rss, fds, threads;
  double ckpt;
};

std::vector<Sample> samples(const std::string& run_dir) {
  std::vector<Sample> out;
  std::ifstream in(fs::path(run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("resources")) continue;
    const auto& r = j["resources"];
    out.push_back({j["step"].get<int64_t>(), r["rss_mib"].get<std::vector<double>>(),
                   r["open_fds"].get<std::vector<double>>(), r["threads"].get<std::vector<double>>(),
                   r["checkpoints_mib"].get<double>()});
  }
  return out;
}

}  // namespace

TEST_CASE("soak, short: 2000 steps with rotation, evaluation and TensorBoard grow no memory, descriptors or threads",
          "[soak][e2e]") {
  const e2e::Setup s = e2e::make_setup_config(
      "soak", "short", "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}",
      "steps: 2000, seq_len: 32, micro_batch_size: 2, global_batch_size: 4, eval_interval: 500, eval_steps: 1");
  for (int world : {1, 2}) {
    const std::string dir = (s.dir / ("world" + std::to_string(world))).string();
    std::string out;
    const int rc = e2e::run_by_hand(s.cfg, world, dir, &out,
                                    "--set checkpoint.interval=500 --set checkpoint.keep_last=2 --set log.interval=100 "
                                    "--set log.tensorboard=true --set log.resources_interval=100 --set log.progress=lines");
    INFO(e2e::tail(out));
    REQUIRE(rc == 0);
    const std::vector<Sample> all = samples(dir);
    REQUIRE(all.size() == 20);
    // The first checkpoint's buffers and the first evaluation are in by
    // step 1000; the last sample is taken while the last step's checkpoint
    // is written (at once, by the writer thread), so it is left out of the
    // descriptor and thread counts.
    std::vector<Sample> early, late;
    for (const Sample& x : all) {
      if (x.step >= 500 && x.step <= 1000) early.push_back(x);
      if (x.step >= 1000 && x.step < 2000) late.push_back(x);
    }
    // One complete checkpoint's bytes, the last one's, after the run.
    double one_ckpt = 0;
    for (const auto& f : fs::recursive_directory_iterator(fs::path(dir) / "ckpt/step_00002000"))
      if (f.is_regular_file()) one_ckpt += double(f.file_size()) / (1 << 20);
    double ckpt_max = 0;
    for (const Sample& x : all) ckpt_max = std::max(ckpt_max, x.ckpt);
    for (int r = 0; r < world; ++r) {
      auto most = [&](const std::vector<Sample>& v, std::vector<double> Sample::*field) {
        double m = 0;
        for (const Sample& x : v) m = std::max(m, (x.*field)[size_t(r)]);
        return m;
      };
      // Growth: the highest resident memory of steps 1500-1900 against that of
      // steps 1000-1400, per step between them. The allocator gives memory
      // back and takes it again around each save (dips of ~0.3 MiB), so a
      // low point is no baseline; a leak raises the peaks.
      double first_half = 0, second_half = 0;
      for (const Sample& x : late) {
        double& peak = x.step < 1500 ? first_half : second_half;
        peak = std::max(peak, x.rss[size_t(r)]);
      }
      const double per_step_kib = (second_half - first_half) * 1024 / 500;
      std::string series;
      for (const Sample& x : all)
        series += " " + std::to_string(x.step) + ":" + std::to_string(x.rss[size_t(r)]).substr(0, 5) + "/" +
                  std::to_string(int(x.fds[size_t(r)])) + "/" + std::to_string(int(x.threads[size_t(r)]));
      std::printf("[soak] %d rank(s), rank %d, resident MiB/descriptors/threads:%s\n", world, r, series.c_str());
      std::printf("[soak] %d rank(s), rank %d, steps 1000-1900: resident peaks %+.3f KiB a step (bound 0.25), descriptors "
                  "at most %.0f then %.0f, threads at most %.0f then %.0f; checkpoints at most %.2f MiB (one: %.2f "
                  "MiB, keep_last 2 + 1 being written: %.2f)\n",
                  world, r, per_step_kib, most(early, &Sample::fds), most(late, &Sample::fds),
                  most(early, &Sample::threads), most(late, &Sample::threads), ckpt_max, one_ckpt, 3 * one_ckpt);
      CHECK(per_step_kib <= 0.25);
      CHECK(most(late, &Sample::fds) <= most(early, &Sample::fds));
      CHECK(most(late, &Sample::threads) <= most(early, &Sample::threads));
    }
    CHECK(ckpt_max <= 3 * one_ckpt * 1.01);
  }
  fs::remove_all(s.dir);
}
