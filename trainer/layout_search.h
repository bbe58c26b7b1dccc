// `trainer plan --search`: every layout of a world size that keeps the
// configuration's global batch: tp (inside a node), pp, cp, dp, ep (MoE),
// sp, ZeRO stage, micro-batch size, recompute and pipeline schedule. A
// layout the run would refuse is dropped by the run's own checks
// (validate_config, resolve_mesh, the sharding plan); the rest are costed
// by the plan (trainer/plan_command.h) and ranked by estimated step time
// among those that fit.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "trainer/hardware.h"

namespace trainer {

struct LayoutResult {
  Config cfg;              // the layout's configuration
  MeshShape mesh;
  double memory = 0;       // bytes per GPU (the fullest stage)
  bool fits = false, refused = false;
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  double compute_s = 0, exposed_comm_s = 0, bubble = 0, recompute_s = 0;
};

struct SearchResult {
  int considered = 0, refused = 0;
  std::vector<LayoutResult> fitting;      // fastest first
  std::vector<LayoutResult> not_fitting;  // fastest first
};
SearchResult search(const Config& c, int world, const Hardware& hw);

// The report: counts, the top `top` layouts that fit with why each loses to
// the first, and the fastest layouts that do not fit with by how much.
std::string search_layouts(const Config& c, int world, const Hardware& hw, int top);

}  // namespace trainer
