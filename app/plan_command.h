// `trainer plan --config run.yaml [--world N] [--gpus-per-node G] [--gpu NAME]
// [--search [--top K]]`: what a layout needs and how fast it should run on
// a GPU of the hardware table (planner/hardware.h), without launching
// anything: the per-GPU memory ledger (the start-up plan's, planner/memory_plan.h),
// the communication per step and group (planner/comm_plan.h), the pipeline
// bubble, and the estimated step time, tokens/s and MFU
// (planner/step_estimate.h). --search ranks every layout of the world size
// (planner/layout_search.h). docs/PLANNING.md explains the model.
#pragma once

#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "planner/gpu_memory.h"

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

// The whole report (with the search when asked). Throws ConfigError for a
// layout or GPU the user got wrong.
std::string describe_plan(const Config& c, const PlanOptions& o);

// The single-layout part of the report, for a resolved mesh.
std::string describe_layout(const Config& c, const MeshShape& mesh, const Hardware& hw);

}  // namespace trainer
