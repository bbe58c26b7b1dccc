// Memory accounting: bytes per rank for parameters, gradients, optimizer
// state, activations and workspace, computed from the same tensor lists the
// arenas allocate, so the plan printed at start-up is what the run holds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "model/sharding.h"
#include "core/tensor.h"
#include "config/config.h"

namespace trainer {

struct MemoryPlan {
  int64_t parameters = 0;     // count
  size_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  size_t activation_bytes = 0, workspace_bytes = 0;
  int dp = 1, zero_stage = 0;  // the per-rank share below is for this layout
  int tp = 1;
  bool sp = false;
  // Activation slots a pipeline stage allocates: its schedule's peak of
  // (micro-batch, chunk) pairs whose slot is held. A slot is held from the
  // receive of the micro-batch's input (its forward on the first stage) until
  // its weight gradients are done and its input gradient has been delivered
  // (pipeline/schedule.h slot_releases), so it can be one more than
  // `in_flight`: the transfer batch that sends one micro-batch's input
  // gradient also receives the next one's input, into a slot of its own.
  int activation_slots = 1;
  int in_flight = 1;  // the peak of pairs between their forward and backward (the timeline's count)
  std::string recompute = "none";  // train.recompute: what the activations leave out (model/recompute.h)
  // optim.offload optimizer: the optimizer's bytes are in host memory
  // (host_bytes, not in total(), which is the device's).
  bool offload = false;
  size_t host_bytes = 0;
  size_t total() const {
    return param_bytes + grad_bytes + optimizer_bytes + activation_bytes + workspace_bytes;
  }
};

// The share of a device's memory a plan may fill. The rest is for what no
// ledger counts: the CUDA context and library workspaces, the caching
// allocator's fragmentation, NCCL's buffers. The smoke test's verdict and
// `trainer plan` ("fits" / "tight") hold a layout to the same limit.
inline constexpr double kUsableMemoryShare = 0.9;
inline bool within_usable_memory(double planned_bytes, double device_bytes) {
  return planned_bytes <= kUsableMemoryShare * device_bytes;
}

// storage: element type of weights, gradients and activations (F32 on the
// CPU; BF16/F16 under mixed precision on a GPU, with fp32 masters).
// dp, zero_stage: parameters, gradients and optimizer state per rank under
// that data-parallel layout (optim/zero.h).
MemoryPlan plan_memory(const Config& c, DType storage = DType::F32, int dp = 1, int zero_stage = 0);
// The rank at `at` of the whole mesh (tensor parallelism divides weights,
// gradients and optimizer state by tp, and with sp the residual stream's
// activations).
MemoryPlan plan_memory(const Config& c, DType storage, const MeshShape& mesh, const Coords& at, int zero_stage);
// The same with the activation slots per pipeline rank and model chunk
// given (Simulation::peak_chunk_slots of this run's schedule at unit costs;
// empty: one each), for callers that plan many ranks of one schedule.
MemoryPlan plan_memory(const Config& c, DType storage, const MeshShape& mesh, const Coords& at, int zero_stage,
                       const std::vector<std::vector<int>>& chunk_slots);
// The ledger of a rank from its chunk plans and the activation slots of
// each chunk (what plan_memory computes once it has them).
MemoryPlan memory_of_plans(const std::vector<ShardingPlan>& plans, const std::vector<int>& slots, const MeshShape& mesh,
                           int zero_stage, bool offload = false);
// What plan_memory takes from the schedule's simulation at unit costs, per
// pipeline rank: the activation slots per model chunk and the peak in
// flight (both empty when the schedule refuses the layout).
struct PipelineOccupancy {
  std::vector<std::vector<int>> chunk_slots;
  std::vector<int> in_flight;
};
PipelineOccupancy pipeline_occupancy(const Config& c, const MeshShape& mesh);
std::vector<std::vector<int>> activation_slots(const Config& c, const MeshShape& mesh);  // its chunk_slots
// "4 micro-batches in flight", or when the slots exceed the peak in flight
// "4 slots: 3 micro-batches between forward and backward + 1 ...".
std::string describe_slots(const MemoryPlan& p);
std::string format_memory_plan(const MemoryPlan& p, const std::string& device_label, DType storage = DType::F32);
std::string format_bytes(double bytes);  // "12.3 MiB"
// One line comparing the per-rank total of every ZeRO stage at this dp, so
// that the choice of stage is made on numbers:
//   "  by ZeRO stage at dp 4: 0: 1.1 GiB | 1: 812 MiB | 2: 640 MiB | 3: 410 MiB (this run: 2)"
std::string format_zero_stages(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                               int this_stage);
// Under tensor parallelism, one line with the activation bytes per rank
// with and without sequence parallelism (the rest of the plan is the same):
//   "  activations with sp: 1.2 MiB | without: 2.0 MiB (this run: sp)"
std::string format_sp_activations(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                                  int stage);

}  // namespace trainer
