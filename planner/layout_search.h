// `trainer plan --search`: every layout of a world size that keeps the
// configuration's global batch: tp (inside a node), pp, cp, dp, ep (MoE),
// sp, ZeRO stage, micro-batch size, recompute and pipeline schedule. A
// layout the run would refuse is dropped by the run's own checks
// (validate_config, resolve_mesh, the sharding plan); the rest are costed
// by their memory (planner/gpu_memory.h) and those that fit are ranked by
// estimated step time, memory headroom and simplicity (ranks_before).
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "planner/hardware.h"

namespace trainer {

struct LayoutResult {
  Config cfg;              // the layout's configuration
  MeshShape mesh;
  double memory = 0;       // bytes per GPU (the fullest stage)
  bool fits = false;       // within the usable share of the device (planner/memory_plan.h kUsableMemoryShare)
  bool tight = false;      // within the device, not within that share
  bool refused = false;
  double step_s = 0, tokens_per_s = 0, mfu = 0;
  // The step's parts (planner/step_estimate.h), each >= 0, adding up to step_s.
  double compute_s = 0, recompute_s = 0, exposed_comm_s = 0, idle_s = 0, optimizer_s = 0;
  double bubble = 0;
};

// How simple a layout is to run, smaller first, compared in order: the
// model-parallel dimensions in use (tp, pp, cp, ep > 1), their product, the
// ZeRO stage, recompute (none, selective, full), sp off before on, the
// schedule (1f1b, gpipe, zb-h1, interleaved), then larger micro-batches.
std::vector<int> simplicity(const LayoutResult& r);

// The ranking: estimated step time to the millisecond, then memory per GPU
// (more headroom first), then simplicity. A strict weak order.
bool ranks_before(const LayoutResult& a, const LayoutResult& b);

struct SearchResult {
  int considered = 0, refused = 0;
  std::vector<LayoutResult> fitting;      // ranked by ranks_before
  std::vector<LayoutResult> not_fitting;  // tight or over the device; fastest compute first
};
SearchResult search(const Config& c, int world, const Hardware& hw);

// The report: counts, the top `top` layouts that fit with why each loses to
// the first, and the fastest layouts that do not fit with by how much.
std::string search_layouts(const Config& c, int world, const Hardware& hw, int top);

}  // namespace trainer
