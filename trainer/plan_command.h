// `trainer plan --config run.yaml [--world N] [--gpus-per-node G] [--gpu NAME]
// [--search [--top K]]`: what a layout needs and how fast it should run on
// a GPU of the hardware table (trainer/hardware.h), without launching
// anything: the per-GPU memory ledger (the start-up plan's, trainer/plan.h),
// the communication per step and group (trainer/comm_plan.h), the pipeline
// bubble, and the estimated step time, tokens/s and MFU
// (trainer/step_estimate.h). --search ranks every layout of the world size
// (trainer/layout_search.h). docs/PLANNING.md explains the model.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "trainer/hardware.h"
#include "trainer/layout_plans.h"
#include "trainer/plan.h"

namespace trainer {

struct PlanOptions {
  int world = 0;          // 0: tp x pp x cp x max(dp, 1) of the configuration
  int gpus_per_node = 0;  // 0: hardware.gpus_per_node, else the table's
  std::string gpu;        // "": hardware.gpu
  bool search = false;
  int top = 10;
  // Set by load_plan_config: how the configuration was fitted to --world.
  std::string world_note;    // "parallel.dp=4 of the file makes 32 GPUs; for --world 64: parallel.dp=8"
  std::string layout_error;  // --search only: why the file's layout is none of --world GPUs
};

// The configuration `trainer plan` describes. Without --world: the file's
// own layout and its world. With --world N: parallel.dp of the file (or of
// --set) describes the file's world, so for another N it becomes
// N / (tp x pp x cp) when that divides, saying so in o.world_note; a layout
// that still is none of N GPUs exits 2 with the run's own message, except
// under --search, which chooses tp, pp, cp and dp itself (o.layout_error).
Config load_plan_config(const std::string& path, const std::vector<std::string>& overrides, PlanOptions& o);

// The per-GPU memory of a layout on the GPU: the fullest pipeline stage's
// ledger, the communication buffers allocated on first use, and the margin.
struct PlanMemory {
  MemoryPlan ledger;            // the stage with the largest total
  int stage = 0;
  size_t comm_buffers = 0;      // kv-head gradient gather, tied-embedding exchange
  size_t total() const { return ledger.total() + comm_buffers; }
  double device = 0;            // bytes
  // Fits: within kUsableMemoryShare of the device (trainer/plan.h), the
  // headroom the smoke test keeps too; tight: within the device but not
  // the headroom; else it does not fit at all.
  double usable() const { return kUsableMemoryShare * device; }
  bool fits() const { return within_usable_memory(double(total()), device); }
  bool tight() const { return !fits() && double(total()) <= device; }
};
PlanMemory plan_gpu_memory(const Config& c, const MeshShape& mesh, const Hardware& hw);
PlanMemory plan_gpu_memory(const MeshShape& mesh, const Hardware& hw, const LayoutPlans& plans, int zero_stage);

// The GPU's storage type: bf16 with fp32 masters, as the CUDA backend runs.
inline constexpr DType kPlanStorage = DType::BF16;

// The whole report (with the search when asked). Throws ConfigError for a
// layout or GPU the user got wrong.
std::string describe_plan(const Config& c, const PlanOptions& o);

// The single-layout part of the report, for a resolved mesh.
std::string describe_layout(const Config& c, const MeshShape& mesh, const Hardware& hw);

// One-key changes that make a layout fit, for the "does not fit" line:
// "parallel.zero_stage=3 (61.2 GiB), train.recompute=full (55.0 GiB)"; ""
// when none does.
std::string fitting_levers(const Config& c, const MeshShape& mesh, const Hardware& hw);

}  // namespace trainer
