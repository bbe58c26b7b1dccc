// A layout's memory on one GPU of the hardware table (planner/hardware.h):
// the fullest pipeline stage's ledger (planner/memory_plan.h), the
// communication buffers allocated on first use, and whether it fits; the
// one-key changes that make it fit. `trainer plan` and its --search read it.
#pragma once

#include <string>

#include "comm/mesh.h"
#include "config/config.h"
#include "planner/hardware.h"
#include "planner/layout_shardings.h"
#include "planner/memory_plan.h"

namespace trainer {

// The per-GPU memory of a layout on the GPU: the fullest pipeline stage's
// ledger, the communication buffers allocated on first use, and the margin.
struct GpuMemory {
  MemoryPlan ledger;            // the stage with the largest total
  int stage = 0;
  size_t comm_buffers = 0;      // kv-head gradient gather, tied-embedding exchange
  size_t total() const { return ledger.total() + comm_buffers; }
  double device = 0;            // bytes
  // Fits: within kUsableMemoryShare of the device (planner/memory_plan.h), the
  // headroom the smoke test keeps too; tight: within the device but not
  // the headroom; else it does not fit at all.
  double usable() const { return kUsableMemoryShare * device; }
  bool fits() const { return within_usable_memory(double(total()), device); }
  bool tight() const { return !fits() && double(total()) <= device; }
};
GpuMemory gpu_memory_of(const Config& c, const MeshShape& mesh, const Hardware& hw);
GpuMemory gpu_memory_of(const MeshShape& mesh, const Hardware& hw, const LayoutShardings& plans, int zero_stage,
                        bool offload = false);

// The GPU's storage type: bf16 with fp32 masters, as the CUDA backend runs.
inline constexpr DType kGpuStorage = DType::BF16;

// One-key changes that make a layout fit, for the "does not fit" line:
// "parallel.zero_stage=3 (61.2 GiB), train.recompute=full (55.0 GiB)"; ""
// when none does.
std::string fitting_levers(const Config& c, const MeshShape& mesh, const Hardware& hw);

}  // namespace trainer
