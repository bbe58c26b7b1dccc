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
};

// The per-GPU memory of a layout on the GPU: the fullest pipeline stage's
// ledger, the communication buffers allocated on first use, and the margin.
struct PlanMemory {
  MemoryPlan ledger;            // the stage with the largest total
  int stage = 0;
  size_t comm_buffers = 0;      // kv-head gradient gather, tied-embedding exchange
  size_t total() const { return ledger.total() + comm_buffers; }
  double device = 0;            // bytes
  bool fits() const { return double(total()) <= device; }
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
