#include "planner/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <tuple>

#include "model/activations.h"
#include "model/recompute.h"
#include "model/params.h"
#include "model/sharding.h"
#include "optim/zero.h"
#include "pipeline/long_simulation.h"
#include "pipeline/pipeline_plan.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"

namespace trainer {

MemoryPlan plan_memory(const Config& c, DType storage, int dp, int zero_stage) {
  MeshShape mesh;
  mesh.dp = dp;
  return plan_memory(c, storage, mesh, Coords{}, zero_stage);
}

PipelineOccupancy pipeline_occupancy(const Config& c, const MeshShape& mesh) {
  // A pipeline stage holds the activations of every micro-batch whose slot
  // is taken at its schedule's peak (1 without a pipeline), per model chunk.
  // The answer depends on the schedule's shape only; `trainer plan --search`
  // asks for the same shapes many times.
  const int64_t m = std::max<int64_t>(1, microbatches_per_step(c, mesh.dp));
  using Key = std::tuple<std::string, int, int64_t, int, bool>;
  static std::mutex mu;
  static std::map<Key, PipelineOccupancy> known;
  const Key key{c.parallel.pp_schedule, mesh.pp, m, pipeline_chunks(c), planned_transfer_mode(c).early_receives};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known.find(key); it != known.end()) return it->second;
  }
  PipelineOccupancy occ;
  try {
    const Simulation sim = simulate_long(c, mesh.pp, m);
    if (sim.ok) {
      occ.chunk_slots = sim.peak_chunk_slots;
      occ.in_flight = sim.peak_in_flight;
    }
  } catch (const std::invalid_argument&) {
    // A layout the schedule refuses: validation names the keys.
  }
  std::lock_guard<std::mutex> lock(mu);
  known[key] = occ;
  return occ;
}

std::vector<std::vector<int>> activation_slots(const Config& c, const MeshShape& mesh) {
  return pipeline_occupancy(c, mesh).chunk_slots;
}

std::string describe_slots(const MemoryPlan& p) {
  if (p.activation_slots == 1) return "one micro-batch";
  const std::string n = std::to_string(p.activation_slots);
  if (p.in_flight >= p.activation_slots) return n + " micro-batches in flight";
  const int extra = p.activation_slots - p.in_flight;
  return n + " slots: " + std::to_string(p.in_flight) + " micro-batch" + (p.in_flight == 1 ? "" : "es") +
         " between forward and backward + " + std::to_string(extra) +
         " receiving its input while an earlier one's input gradient is sent";
}

MemoryPlan plan_memory(const Config& c, DType storage, const MeshShape& mesh, const Coords& at, int zero_stage) {
  const PipelineOccupancy occ = pipeline_occupancy(c, mesh);
  MemoryPlan p = plan_memory(c, storage, mesh, at, zero_stage, occ.chunk_slots);
  if (size_t(at.pp) < occ.in_flight.size()) p.in_flight = std::min(p.activation_slots, occ.in_flight[size_t(at.pp)]);
  return p;
}

MemoryPlan plan_memory(const Config& c, DType storage, const MeshShape& mesh, const Coords& at, int zero_stage,
                       const std::vector<std::vector<int>>& chunk_slots) {
  const ModelDims g = make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
  const int chunks = pipeline_chunks(c);
  const std::vector<int64_t> layers = stage_layers_for(c, g, mesh.pp * chunks);
  const std::vector<ShardingPlan> plans =
      chunk_plans(g, c.model.init_std, mesh, at, zero_stage, c.parallel.sp, layers, chunks);
  std::vector<int> slots(size_t(chunks), 1);
  if (size_t(at.pp) < chunk_slots.size()) slots = chunk_slots[size_t(at.pp)];
  return memory_of_plans(plans, slots, mesh, zero_stage, c.optim.offload == "optimizer");
}

MemoryPlan memory_of_plans(const std::vector<ShardingPlan>& plans, const std::vector<int>& slots, const MeshShape& mesh,
                           int zero_stage, bool offload) {
  MemoryPlan p;
  p.tp = mesh.tp;
  p.sp = plans.front().sp;
  p.dp = mesh.dp * mesh.cp;
  p.zero_stage = zero_stage;
  p.recompute = recompute_name(plans.front().local.recompute);
  p.offload = offload;
  p.activation_slots = 0;
  p.in_flight = 0;
  for (size_t k = 0; k < plans.size(); ++k) {
    const ShardingPlan& plan = plans[k];
    const ModelDims& d = plan.local;
    p.parameters += parameter_count(plan.params);
    const ZeroBytes z = zero_bytes(plan, zero_stage, offload);
    p.param_bytes += z.params;
    p.grad_bytes += z.grads;
    p.optimizer_bytes += z.optimizer;
    p.host_bytes += z.host;
    p.activation_bytes += arena_bytes(activation_specs(d)) * size_t(slots[k]);
    p.activation_slots += slots[k];
    p.in_flight += slots[k];  // unless the caller knows the schedule's count (plan_memory)
    p.workspace_bytes += arena_bytes(grad_scratch_specs(d));
  }
  return p;
}

std::string format_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return buf;
}

std::string format_memory_plan(const MemoryPlan& p, const std::string& device_label, DType storage) {
  const char* st = dtype_name(storage);
  const bool mixed = storage != DType::F32;
  // What each rank keeps of the three states that ZeRO shards.
  const std::string part = p.dp > 1 ? ", 1/" + std::to_string(p.dp) + " shard" : "";
  // Tensor parallelism splits every matrix; norms (and row biases, the
  // router) stay whole on each tp rank.
  const std::string split = p.tp > 1 ? ", matrices 1/" + std::to_string(p.tp) : "";
  const std::string pshard = split + (p.zero_stage >= 3 ? part + " + unit gather buffers" : "");
  const std::string gshard = split + (p.zero_stage >= 2 ? part + " + unit reduce buffers" : "");
  const std::string oshard = split + (p.zero_stage >= 1 ? part : "");
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "memory plan per rank (%s%s), %.3fM parameters:\n"
                "  parameters   %12s  (%s%s)\n"
                "  gradients    %12s  (%s%s)\n"
                "  optimizer    %12s  (AdamW m, v%s, F32%s)%s\n"
                "  activations  %12s  (%s, saved for backward%s%s)\n"
                "  workspace    %12s  (backward scratch%s)\n"
                "  total        %12s\n",
                device_label.c_str(),
                ((p.tp > 1 ? ", tensor parallel " + std::to_string(p.tp) + (p.sp ? " + sp" : "") : std::string()) +
                 (p.dp > 1 || p.zero_stage > 0
                      ? ", data parallel " + std::to_string(p.dp) + ", ZeRO stage " + std::to_string(p.zero_stage)
                      : std::string()))
                    .c_str(),
                double(p.parameters) / 1e6, format_bytes(double(p.param_bytes)).c_str(), st, pshard.c_str(),
                format_bytes(double(p.grad_bytes)).c_str(), st, gshard.c_str(),
                format_bytes(double(p.optimizer_bytes)).c_str(), mixed ? ", master weights" : "", oshard.c_str(),
                p.offload ? ("; ZeRO-Offload: in host memory, " + format_bytes(double(p.host_bytes)) +
                             " per rank with the fp32 masters and gradients, not in the total")
                                .c_str()
                          : "",
                format_bytes(double(p.activation_bytes)).c_str(),
                describe_slots(p).c_str(),
                p.sp ? "; residual stream and norm outputs 1/tp under sp" : "",
                p.recompute == "none" ? "" : ("; recompute " + p.recompute).c_str(),
                format_bytes(double(p.workspace_bytes)).c_str(),
                p.recompute == "none" ? "" : " + one layer's recomputed activations",
                format_bytes(double(p.total())).c_str());
  return buf;
}

}  // namespace trainer

namespace trainer {

std::string format_zero_stages(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                               int this_stage) {
  std::string line = "  by ZeRO stage at dp " + std::to_string(mesh.dp * mesh.cp) + ":";
  for (int stage = 0; stage <= 3; ++stage)
    line += std::string(stage ? " |" : "") + " " + std::to_string(stage) + ": " +
            format_bytes(double(plan_memory(c, storage, mesh, at, stage).total()));
  return line + " (this run: " + std::to_string(this_stage) + ")\n";
}

std::string format_sp_activations(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                                  int stage) {
  if (mesh.tp <= 1) return "";
  Config with = c, without = c;
  with.parallel.sp = true;
  without.parallel.sp = false;
  const bool divides = c.train.seq_len % mesh.tp == 0;
  const std::string sp = divides ? format_bytes(double(plan_memory(with, storage, mesh, at, stage).activation_bytes))
                                 : "n/a (train.seq_len not divisible by tp)";
  return "  activations with sp: " + sp + " | without: " +
         format_bytes(double(plan_memory(without, storage, mesh, at, stage).activation_bytes)) + " (this run: " +
         (c.parallel.sp ? "sp" : "no sp") + ")\n";
}

}  // namespace trainer
