// Activation recompute through the real binary on CPU processes over Gloo:
// selective and full recompute compose with every axis (tp with sp, cp's
// ring, ep's all-to-all, pp stages, ZeRO-3's gathered weights) and
// reproduce the one-process run that keeps every activation (losses rel
// 1e-5, final weights rel 1e-4); in one layout the recompute run equals the
// same layout without it bit for bit (every loss, every weight).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// Layer 0 dense, layer 1 MoE with the load-balancing loss and a capacity:
// under cp a full recompute re-runs the whole-sequence statistics and
// admission (model/moe_routing_plan.h) with their collectives.
const char* const kModel =
    "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
    "moe: {num_experts: 4, top_k: 2, d_ff: 32, every: 2, aux_loss_coeff: 0.1, capacity_factor: 1.0}}";

}  // namespace

TEST_CASE("recompute selective and full under tp2 sp x cp2, ep2 x pp2, ZeRO-3 (both) == one process", "[recompute][e2e]") {
  const e2e::Setup s = e2e::make_setup("recompute", "layouts", kModel);
  e2e::run_cases(s, "recompute",
                 {
                     {"full tp2 sp x cp2", 4,
                      "--set parallel.tp=2 --set parallel.sp=true --set parallel.cp=2 --set train.recompute=full"},
                     {"selective tp2 sp x cp2", 4,
                      "--set parallel.tp=2 --set parallel.sp=true --set parallel.cp=2 --set train.recompute=selective"},
                     {"full first layer pp2 x dp2 ep2", 4,
                      "--set parallel.pp=2 --set parallel.ep=2 --set parallel.zero_stage=1 --set train.recompute=full "
                      "--set train.recompute_layers=1"},
                     {"selective dp2 ep2 zero3", 2,
                      "--set parallel.ep=2 --set parallel.zero_stage=3 --set train.recompute=selective"},
                     {"full dp2 zero3", 2, "--set parallel.zero_stage=3 --set train.recompute=full"},
                 },
                 {"recompute (activations + workspace): none "});
  // The same layout without recompute: nothing may differ.
  std::string out;
  const std::string none = (s.dir / "none_tp2_sp_x_cp2").string();
  REQUIRE(e2e::run_by_hand(s.cfg, 4, none, &out, "--set parallel.tp=2 --set parallel.sp=true --set parallel.cp=2") == 0);
  const std::vector<double> a = e2e::losses(fs::path(none) / "metrics.jsonl"),
                            b = e2e::losses(s.dir / "full_tp2_sp_x_cp2/metrics.jsonl");
  REQUIRE(a.size() == 20);
  CHECK(a == b);
  size_t differ = 0, total = 0;
  const auto wa = e2e::model_tensors(fs::path(none) / "ckpt/step_00000020"),
             wb = e2e::model_tensors(s.dir / "full_tp2_sp_x_cp2/ckpt/step_00000020");
  for (const auto& [name, v] : wa) {
    REQUIRE(wb.count(name));
    for (size_t i = 0; i < v.size(); ++i) differ += std::memcmp(&v[i], &wb.at(name)[i], sizeof(float)) != 0;
    total += v.size();
  }
  std::printf("[recompute] tp2 sp x cp2, full vs none: %zu of 20 losses differ, %zu of %zu weights differ (want 0)\n",
              size_t(a != b) * 20, differ, total);
  CHECK(differ == 0);
  fs::remove_all(s.dir);
}

TEST_CASE("recompute configuration mistakes exit 2 naming the keys", "[recompute][cli][config]") {
  e2e::expect_config_errors({
      {"--world 2 --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 --set train.recompute=full",
       "parallel.pp_schedule=zb-h1 with train.recompute=full"},
      {"--set train.recompute_layers=3", "train.recompute_layers=3 exceeds model.n_layers=2"},
      {"--set train.recompute=some", "train.recompute"},
  });
}
