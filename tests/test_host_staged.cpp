// parallel.backend host (comm/host_staged_communicator.h) copies each
// collective's tensors through host buffers and runs Gloo on the copies.
// On CPU processes the copies are memcpys of the same values, so every
// mesh axis must give the Gloo run's losses, gradient norms and final
// weights bit for bit: tp, tp with sp, pp with 1f1b and zb-h1, cp, ep
// (MoE), dp with ZeRO-3 and full recompute, 2 ranks each. The start-up
// line says which backend and why, and nccl is refused on the CPU.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "config/config.h"
#include "e2e_util.h"
#include "runtime/comm_backend.h"

namespace fs = std::filesystem;
using namespace trainer;

TEST_CASE("parallel.backend: which backend and why, nccl refused where it cannot serve", "[comm][config]") {
  CHECK(choose_backend("auto", Device::CPU, 4, 0).line == "comm: gloo (CPU tensors)\n");
  CHECK_FALSE(choose_backend("auto", Device::CPU, 4, 0).host_staged);
  CHECK(choose_backend("host", Device::CPU, 4, 0).host_staged);
  CHECK_THROWS_WITH(choose_backend("nccl", Device::CPU, 2, 0),
                    "parallel.backend=nccl needs GPU tensors, and this run is on the CPU: use parallel.backend=auto");
  // One lent GPU, two ranks: NCCL refuses two ranks on one device.
  const BackendChoice shared = choose_backend("auto", Device::CUDA, 2, 1);
  CHECK(shared.host_staged);
  CHECK(shared.line == "comm: host-staged gloo (2 ranks on this node share 1 GPU(s), and NCCL needs a GPU per rank; "
                       "parallel.backend=auto)\n");
  const BackendChoice own = choose_backend("auto", Device::CUDA, 8, 8);
  CHECK_FALSE(own.host_staged);
  CHECK(own.line == "comm: nccl (each of the 8 ranks on this node has its own GPU; parallel.backend=auto)\n");
  CHECK(choose_backend("host", Device::CUDA, 8, 8).host_staged);
  CHECK_THROWS_WITH(choose_backend("nccl", Device::CUDA, 2, 1),
                    "parallel.backend=nccl: 2 ranks on this node share 1 GPU(s), and NCCL needs a GPU per rank; use "
                    "parallel.backend=host (or auto)");
}

TEST_CASE("parallel.backend host gives the Gloo run bit for bit on every mesh axis", "[comm][e2e]") {
  const e2e::Setup dense = e2e::make_setup("host_staged", "host_staged", "{arch: llama, vocab_size: 256, d_model: 32, "
                                                                         "n_layers: 4, n_heads: 4, n_kv_heads: 2, "
                                                                         "max_seq_len: 32}");
  const e2e::Setup moe = e2e::make_setup("host_staged_moe", "host_staged_moe",
                                         "{arch: llama, vocab_size: 256, d_model: 32, n_layers: 2, n_heads: 4, "
                                         "max_seq_len: 32, moe: {num_experts: 4, top_k: 2}}");
  struct Layout {
    const char* label;
    const e2e::Setup* setup;
    std::string set;
  };
  const std::vector<Layout> layouts = {
      {"tp2", &dense, "--set parallel.tp=2"},
      {"tp2_sp", &dense, "--set parallel.tp=2 --set parallel.sp=true"},
      {"pp2_1f1b", &dense, "--set parallel.pp=2 --set parallel.pp_schedule=1f1b"},
      {"pp2_zbh1", &dense, "--set parallel.pp=2 --set parallel.pp_schedule=zb-h1"},
      {"cp2", &dense, "--set parallel.cp=2"},
      {"ep2_moe", &moe, "--set parallel.ep=2"},
      {"dp2_zero3", &dense, "--set parallel.zero_stage=3"},
      {"dp2_recompute_full", &dense, "--set train.recompute=full"},
  };
  for (const Layout& l : layouts) {
    std::vector<std::string> dirs;
    std::string host_out;
    for (const char* backend : {"auto", "host"}) {
      const std::string rd = (l.setup->dir / (std::string(l.label) + "_" + backend)).string();
      std::string out;
      const int rc = e2e::run_by_hand(l.setup->cfg, 2, rd, &out, l.set + " --set parallel.backend=" + backend);
      INFO(l.label << " backend " << backend << "\n" << e2e::tail(out));
      REQUIRE(rc == 0);
      dirs.push_back(rd);
      if (std::string(backend) == "host") host_out = out;
    }
    const fs::path a = fs::path(dirs[0]) / "metrics.jsonl", b = fs::path(dirs[1]) / "metrics.jsonl";
    const auto la = e2e::losses(a), lb = e2e::losses(b);
    const auto ga = e2e::metric(a, "grad_norm"), gb = e2e::metric(b, "grad_norm");
    const double w = e2e::weight_diff(fs::path(dirs[0]) / "ckpt/step_00000020", fs::path(dirs[1]) / "ckpt/step_00000020");
    size_t same = 0;
    for (size_t i = 0; i < la.size() && i < lb.size(); ++i) same += la[i] == lb[i];
    std::printf("[host-staged] %-19s %zu of %zu losses equal to Gloo's bit for bit, grad norms %s, final weights rel L2 "
                "diff %.1e (required: all equal, 0)\n",
                l.label, same, la.size(), ga == gb ? "equal" : "DIFFER", w);
    INFO(l.label);
    CHECK(host_out.find("comm: host-staged gloo (parallel.backend=host") != std::string::npos);
    CHECK(la.size() == 20);
    CHECK(la == lb);
    CHECK(ga == gb);
    CHECK(w == 0);
  }
  fs::remove_all(dense.dir);
  fs::remove_all(moe.dir);
}
