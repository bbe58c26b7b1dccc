// The start-up lines of a training run, one function per part of the
// session it describes (train/session.h prints each as that part is known):
// the device and layout line, the memory plan and its trades, the model and
// the batch, the per-axis reports of the layout, the allocation held to the
// plan, and the data's tokenizer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "interop/run_tokenizer.h"
#include "model/sharding.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"
#include "planner/memory_plan.h"
#include "runtime/device_select.h"

namespace trainer {

// "cpu, 2 threads (BLAS: ...), storage f32, tensor parallel 2 with sp, ..."
std::string format_run_line(const Config& cfg, const DeviceChoice& dev, DType storage, const MeshShape& mesh,
                            int threads);

// The memory ledger and what ZeRO, sp and recompute trade in it.
std::string format_memory_report(const Config& cfg, const MemoryPlan& plan, const DeviceChoice& dev, DType storage,
                                 const MeshShape& mesh, const Coords& at);

// "model: llama, 4 layers, d_model 64, ..." and "batch: ... tokens/step ...".
std::string format_model_line(const Config& cfg, const ModelDims& dims);
std::string format_batch_line(const Config& cfg, int64_t microbatches);

// Each parallel axis's report: pipeline, tensor-parallel traffic, MoE
// routing, experts, context.
std::string format_layout_report(const Config& cfg, const ModelDims& dims, const std::vector<int64_t>& stage_layers,
                                 const Schedule& schedule, const Simulation& simulated, DType storage,
                                 const MeshShape& mesh, const std::vector<ShardingPlan>& plans, int64_t microbatches);

// Throws std::logic_error unless the stage models hold what the plan says,
// to the byte; the line that says so.
void check_allocation(const MemoryPlan& plan, size_t param_bytes, size_t grad_bytes, size_t optimizer_bytes,
                      size_t host_bytes);
std::string format_allocation_line(const MemoryPlan& plan);

// "tokenizer: ..., copied to RUN/tokenizer/" and its warning, if any.
std::string format_tokenizer_line(const TokenizerFiles& files, const Config& cfg, const std::string& run_dir);

}  // namespace trainer
