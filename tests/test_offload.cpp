// optim.offload optimizer (ZeRO-Offload): the fp32 masters, the AdamW
// moments and the update live in host memory; gradients go to the host and
// the updated weights come back. On CPU processes both sides are host
// memory, so the data movement is the same code over memcpys and the run
// must be the run without offload bit for bit: losses, gradient norms and
// final weights, with ZeRO 0 to 3 over two data-parallel ranks. A checkpoint
// written with offload resumes without it and the other way round, and the
// memory plan counts the host bytes apart from the device's.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

struct Compared {
  size_t same = 0, count = 0;
  bool grad_norms_equal = false;
  double weights = 0;
};

Compared compare_runs(const std::string& a, const std::string& b) {
  const fs::path ma = fs::path(a) / "metrics.jsonl", mb = fs::path(b) / "metrics.jsonl";
  const auto la = e2e::losses(ma), lb = e2e::losses(mb);
  Compared c;
  c.count = la.size();
  for (size_t i = 0; i < la.size() && i < lb.size(); ++i) c.same += la[i] == lb[i];
  if (la.size() != lb.size()) c.same = 0;
  c.grad_norms_equal = e2e::metric(ma, "grad_norm") == e2e::metric(mb, "grad_norm");
  c.weights = e2e::weight_diff(fs::path(a) / "ckpt/step_00000020", fs::path(b) / "ckpt/step_00000020");
  return c;
}

}  // namespace

TEST_CASE("optim.offload optimizer gives the run without offload bit for bit at every ZeRO stage", "[optim][e2e]") {
  const e2e::Setup s = e2e::make_setup("offload", "offload", "{arch: llama, vocab_size: 256, d_model: 32, "
                                                             "n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                                                             "max_seq_len: 32}");
  for (int stage : {0, 1, 2, 3}) {
    const std::string layout = "--set parallel.zero_stage=" + std::to_string(stage);
    std::vector<std::string> dirs;
    std::string offload_out;
    for (const char* offload : {"none", "optimizer"}) {
      const std::string rd = (s.dir / ("zero" + std::to_string(stage) + "_" + offload)).string();
      std::string out;
      const int rc = e2e::run_by_hand(s.cfg, 2, rd, &out, layout + " --set optim.offload=" + offload);
      INFO("zero " << stage << " offload " << offload << "\n" << e2e::tail(out));
      REQUIRE(rc == 0);
      dirs.push_back(rd);
      if (std::string(offload) == "optimizer") offload_out = out;
    }
    const Compared c = compare_runs(dirs[0], dirs[1]);
    std::printf("[offload] dp2 zero %d: %zu of %zu losses equal to no offload bit for bit, grad norms %s, final "
                "weights rel L2 diff %.1e (required: all equal, 0)\n",
                stage, c.same, c.count, c.grad_norms_equal ? "equal" : "DIFFER", c.weights);
    INFO("zero " << stage << "\n" << e2e::tail(offload_out));
    CHECK(c.count == 20);
    CHECK(c.same == c.count);
    CHECK(c.grad_norms_equal);
    CHECK(c.weights == 0);
    // The run's own memory plan puts the optimizer in host memory.
    CHECK(offload_out.find("ZeRO-Offload: in host memory") != std::string::npos);
  }

  // Checkpoints: one written with offload resumes without it, and one
  // written without resumes with it; both continue the uninterrupted run
  // without offload bit for bit.
  const std::string straight = (s.dir / "zero2_none").string();
  struct Leg {
    const char* label;
    const char* first;
    const char* second;
  };
  for (const Leg& leg : {Leg{"offload -> none", "optimizer", "none"}, Leg{"none -> offload", "none", "optimizer"}}) {
    const std::string tag = std::string(leg.first) + "_then_" + leg.second;
    const std::string a = (s.dir / (tag + "_a")).string(), b = (s.dir / (tag + "_b")).string();
    const std::string layout = "--set parallel.zero_stage=2";
    std::string out;
    REQUIRE(e2e::run_by_hand(s.cfg, 2, a, &out, layout + " --set optim.offload=" + leg.first + " --stop-after 10") == 0);
    out.clear();
    const int rc = e2e::run_by_hand(s.cfg, 2, b, &out,
                                    layout + " --set optim.offload=" + leg.second + " --set checkpoint.resume=" + a +
                                        "/ckpt/step_00000010");
    INFO(leg.label << "\n" << e2e::tail(out));
    REQUIRE(rc == 0);
    CHECK(out.find("resumed from " + a + "/ckpt/step_00000010 at step 10") != std::string::npos);
    const auto joined = e2e::joined_losses({a, b});
    const auto whole = e2e::losses(fs::path(straight) / "metrics.jsonl");
    const double w = e2e::weight_diff(fs::path(straight) / "ckpt/step_00000020", fs::path(b) / "ckpt/step_00000020");
    size_t same = 0;
    for (size_t i = 0; i < joined.size() && i < whole.size(); ++i) same += joined[i] == whole[i];
    std::printf("[offload] resume %s at step 10: %zu of %zu losses equal to the uninterrupted run, final weights rel L2 "
                "diff %.1e (required: all equal, 0)\n",
                leg.label, same, whole.size(), w);
    CHECK(joined.size() == 20);
    CHECK(same == whole.size());
    CHECK(w == 0);
  }
  fs::remove_all(s.dir);
}
