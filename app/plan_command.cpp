#include "app/plan_command.h"

#include <algorithm>
#include <cstdio>

#include "config/config_schema.h"
#include "interop/hf_import.h"
#include "model/sharding.h"
#include "observe/placement_report.h"
#include "pipeline/pipeline_plan.h"
#include "planner/comm_plan.h"
#include "planner/layout_search.h"
#include "planner/step_estimate.h"

namespace trainer {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string fmt(const char* f, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, a);
  return buf;
}

std::string link_name(const GroupTime& t) {
  return (t.across_nodes ? "network " : "in-node ") + fmt("%.1f GB/s", t.bandwidth / 1e9);
}

// Seconds as "12.3 ms" or "4.56 s".
std::string seconds(double s) { return s < 1 ? fmt("%.1f ms", s * 1e3) : fmt("%.2f s", s); }

}  // namespace

static std::string memory_verdict(const Config& c, const MeshShape& mesh, const Hardware& hw, const GpuMemory& mem) {
  const double total = double(mem.total());
  char head[160], limit[200];
  std::snprintf(head, sizeof head, "%s of %s (%.1f%%), ", format_bytes(total).c_str(), format_bytes(mem.device).c_str(),
                100 * total / mem.device);
  std::snprintf(limit, sizeof limit,
                "the %.0f%% a plan may fill (%s; the rest is for the CUDA context, the allocator's fragmentation and "
                "NCCL buffers, which the ledger does not count)",
                100 * kUsableMemoryShare, format_bytes(mem.usable()).c_str());
  if (mem.fits())
    return std::string("  fits: ") + head + "within " + limit + ": " + format_bytes(mem.usable() - total) +
           " to spare\n";
  const std::string levers = fitting_levers(c, mesh, hw);
  const std::string how = levers.empty() ? "no single change of parallel.zero_stage, train.recompute, "
                                           "optim.offload or train.micro_batch_size fits: raise parallel.tp "
                                           "or parallel.pp"
                                         : "it fits with " + levers;
  if (mem.tight())
    return std::string("  TIGHT: ") + head + format_bytes(total - mem.usable()) + " over " + limit + "; " + how + "\n";
  return std::string("  DOES NOT FIT: ") + head + format_bytes(total - mem.device) + " over the device; " + how +
         (levers.empty() ? "" : " (within the " + std::to_string(int(100 * kUsableMemoryShare + 0.5)) + "% a plan may fill)") +
         "\n";
}

std::string describe_layout(const Config& c, const MeshShape& mesh, const Hardware& hw) {
  std::string out;
  const int64_t m = microbatches_per_step(c, mesh.dp);
  out += describe(mesh) + (c.parallel.sp ? ", sp" : "") + ", ZeRO " + std::to_string(c.parallel.zero_stage) +
         ", micro-batch " + std::to_string(c.train.micro_batch_size) + ", recompute " + c.train.recompute +
         (mesh.pp > 1 ? ", schedule " + c.parallel.pp_schedule : std::string()) + "\n";
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "batch: %d sequences x %d tokens = %lld tokens per step; %lld micro-batch%s of %d per step on each "
                "data-parallel rank (accumulation steps)\n",
                c.train.global_batch_size, c.train.seq_len, (long long)(int64_t(c.train.global_batch_size) * c.train.seq_len),
                (long long)m, m == 1 ? "" : "es", c.train.micro_batch_size);
  out += buf;

  // 1. Memory: the ledger every run prints at start-up.
  const GpuMemory mem = gpu_memory_of(c, mesh, hw);
  out += format_memory_plan(mem.ledger, hw.name + (mesh.pp > 1 ? ", pipeline stage " + std::to_string(mem.stage) + " (the fullest)" : ""),
                     kGpuStorage);
  if (mem.comm_buffers > 0) {
    std::snprintf(buf, sizeof buf, "  comm buffers %12s  (allocated on first use: kv-head gradient gather, tied-embedding exchange)\n",
                  format_bytes(double(mem.comm_buffers)).c_str());
    out += buf;
  }
  out += memory_verdict(c, mesh, hw, mem);

  // 2. Communication per step and group, and 4. the time model.
  const StepEstimate e = estimate_step(c, mesh, hw, kGpuStorage);
  out += "communication per step on " +
         (mesh.pp > 1 ? "pipeline stage " + std::to_string(e.critical_stage) + " (the critical one)"
                      : std::string("rank 0")) +
         " (payload: the collectives' tensors; sent: ring bytes leaving the rank):\n";
  std::snprintf(buf, sizeof buf, "  %-6s %5s  %-22s %11s %11s %10s %10s  %s\n", "group", "ranks", "link", "payload", "sent",
                "time", "exposed", "overlap");
  out += buf;
  for (const GroupTime& g : e.groups) {
    if (g.size <= 1) continue;
    std::snprintf(buf, sizeof buf, "  %-6s %5d  %-22s %11s %11s %10s %10s  %s\n", g.label.c_str(), g.size,
                  link_name(g).c_str(), format_bytes(g.payload).c_str(), format_bytes(g.wire_bytes).c_str(),
                  seconds(g.seconds).c_str(), seconds(g.exposed).c_str(), g.note.c_str());
    out += buf;
  }

  // 3. The pipeline.
  std::snprintf(buf, sizeof buf, "pipeline: %d stage%s, %lld micro-batches per step: bubble %.1f%% simulated, %s = %.1f%% textbook\n",
                mesh.pp, mesh.pp == 1 ? "" : "s", (long long)m, 100 * e.bubble, e.textbook_formula,
                100 * e.textbook_bubble);
  out += buf;
  std::snprintf(buf, sizeof buf,
                "estimate (a prediction, not a measurement)%s: compute %s + exposed communication %s + pipeline idle %s "
                "+ optimizer %s = step %s, %.0f tokens/s, MFU %.1f%% (model FLOPs as docs/PLANNING.md counts them, "
                "causal attention at half the T x T work; at most the %.0f%% matmul efficiency)\n",
                mesh.pp > 1 ? (" on pipeline stage " + std::to_string(e.critical_stage)).c_str() : "",
                seconds(e.compute_s).c_str(), seconds(e.exposed_comm_s).c_str(), seconds(e.idle_s).c_str(),
                seconds(e.optimizer_s).c_str(), seconds(e.step_s).c_str(), e.tokens_per_s, 100 * e.mfu,
                100 * hw.matmul_efficiency);
  out += buf;
  return out;
}

Config load_plan_config(const std::string& path, const std::vector<std::string>& overrides, PlanOptions& o) {
  // model.init_from's config.json stands for the model keys the file leaves out, as in a run.
  const ConfigFill adopt = [](Config& c) { adopt_init_from_settings(c); };
  const Config own = load_config_file(path, overrides, 0, adopt);  // the layout the file itself describes
  const ParallelConfig& p = own.parallel;
  if (o.world <= 0) {
    o.world = p.tp * p.pp * p.cp * (p.dp > 0 ? p.dp : 1);
    return own;
  }
  try {
    return load_config_file(path, overrides, o.world, adopt);
  } catch (const ConfigError& e) {
    std::string why = e.what();
    const int model_parallel = p.tp * p.pp * p.cp;
    if (p.dp > 0 && o.world % model_parallel == 0) {
      std::vector<std::string> with = overrides;
      const int dp = o.world / model_parallel;
      with.push_back("parallel.dp=" + std::to_string(dp));
      try {
        Config c = load_config_file(path, with, o.world, adopt);
        o.world_note = "parallel.dp=" + std::to_string(p.dp) + " makes " + std::to_string(model_parallel * p.dp) +
                       " GPUs; for --world " + std::to_string(o.world) + " the plan uses parallel.dp=" +
                       std::to_string(dp);
        return c;
      } catch (const ConfigError& e2) {
        why = e2.what();
      }
    }
    if (!o.search) throw ConfigError(why);
    o.layout_error = why;
    return own;
  }
}

std::string describe_plan(const Config& c, const PlanOptions& o) {
  Config cfg = c;
  if (o.gpus_per_node > 0) cfg.hardware.gpus_per_node = o.gpus_per_node;
  const Hardware hw = resolve_hardware(cfg, o.gpu);
  const int world = o.world;
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "plan for %s: %d GPU%s of %s (%d per node): %.0f GiB, %.4g TFLOP/s bf16 dense x %.2f matmul efficiency, "
                "HBM %.0f GB/s, in-node %.4g GB/s, network %.3g Gbit/s per GPU (%s)\n",
                c.source.c_str(), world, world == 1 ? "" : "s", hw.name.c_str(), hw.gpus_per_node, hw.memory_gib,
                hw.bf16_tflops, hw.matmul_efficiency, hw.hbm_gb_s, hw.nvlink_gb_s, hw.network_gbit_s, hw.source);
  std::string out = buf;
  if (!o.world_note.empty()) out += o.world_note + "\n";
  if (o.layout_error.empty()) {
    const MeshShape mesh = resolve_mesh(cfg.parallel, world, std::min(world, hw.gpus_per_node));
    out += "this configuration: " + describe_layout(cfg, mesh, hw);
    // The run's own placement line (observe/placement_report.h) for ranks
    // numbered node after node, as launchers number them: what the time
    // model counts as in-node or network is what the run will report.
    if (world > 1) {
      std::vector<std::string> host_of_rank;
      for (int r = 0; r < world; ++r) host_of_rank.push_back("node" + std::to_string(r / std::max(1, hw.gpus_per_node)));
      out += format_placement(mesh, host_of_rank);
    }
  } else {
    out += "this configuration is no layout of " + std::to_string(world) + " GPUs (" + o.layout_error +
           "); the search chooses tp, pp, cp and dp itself\n";
  }
  if (o.search) out += search_layouts(cfg, world, hw, o.top);
  return out;
}

}  // namespace trainer
