// MoE with the load-balancing loss, dropless and with a capacity, top-1 and
// top-2, on every layout that splits a micro-batch's sequences (cp 2,
// tp 2 x cp 2, tp 2 with sp, cp 2 x ep 2) reproduces the one-process run:
// losses, load-balancing losses, validation losses and final weights
// (tests/e2e_util.h tolerances). The router statistics and the capacity's
// admission are whole-sequence under cp (model/moe_routing_plan.h); with them
// per chunk these runs drift by ~1e-2 in loss.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "e2e_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// A strong load-balancing weight, so that a wrong statistic shows in the
// weights within 20 steps; capacity 1.0 drops tokens on most steps.
std::string moe_model(int top_k, double capacity_factor) {
  return "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
         "moe: {num_experts: 4, top_k: " +
         std::to_string(top_k) + ", d_ff: 32, aux_loss_coeff: 0.1, capacity_factor: " +
         std::to_string(capacity_factor) + "}}";
}

const std::vector<e2e::Case> kSplitLayouts = {
    {"cp2", 2, "--set parallel.cp=2"},
    {"tp2 x cp2", 4, "--set parallel.tp=2 --set parallel.cp=2"},
    {"tp2 sp", 2, "--set parallel.tp=2 --set parallel.sp=true"},
    {"cp2 x ep2", 2, "--set parallel.cp=2 --set parallel.ep=2"},
};

void check_layouts(const std::string& name, int top_k, double capacity_factor) {
  const e2e::Setup s = e2e::make_setup("moe_layouts", name, moe_model(top_k, capacity_factor));
  e2e::run_cases(s, "moe " + name, kSplitLayouts, {});
  fs::remove_all(s.dir);
}

}  // namespace

TEST_CASE("MoE top-2 with the aux loss, dropless: cp 2, tp 2 x cp 2, tp 2 sp, cp 2 x ep 2 == one process",
          "[moe][cp][e2e]") {
  check_layouts("top2_dropless", 2, 0.0);
}

TEST_CASE("MoE top-2 with the aux loss and capacity 1.0: every split layout == one process", "[moe][cp][e2e]") {
  check_layouts("top2_capacity", 2, 1.0);
}

TEST_CASE("MoE top-1 with the aux loss, dropless: every split layout == one process", "[moe][cp][e2e]") {
  check_layouts("top1_dropless", 1, 0.0);
}

TEST_CASE("MoE top-1 with the aux loss and capacity 1.0: every split layout == one process", "[moe][cp][e2e]") {
  check_layouts("top1_capacity", 1, 1.0);
}
