#include "train/startup_report.h"

#include <cstdio>
#include <memory>
#include <stdexcept>

#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/blas_info.h"
#include "model/tp_traffic.h"
#include "observe/context_report.h"
#include "observe/expert_report.h"
#include "observe/pipeline_report.h"
#include "observe/recompute_report.h"

namespace trainer {

std::string format_run_line(const Config& cfg, const DeviceChoice& dev, DType storage, const MeshShape& mesh,
                            int threads) {
  const int stage = cfg.parallel.zero_stage;
  std::string out = dev.line + ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
  if (dev.device == Device::CPU) out += " (BLAS: OpenBLAS " + cpu::blas_threading() + ")";
  out += std::string(", storage ") + dtype_name(storage);
  if (mesh.tp > 1) out += ", tensor parallel " + std::to_string(mesh.tp) + (cfg.parallel.sp ? " with sp" : "");
  if (mesh.cp > 1)
    out += ", context parallel " + std::to_string(mesh.cp) + " (zigzag chunks of " +
           std::to_string(cfg.train.seq_len / (2 * mesh.cp)) + " tokens, ring attention)";
  if (mesh.dp > 1 || stage > 0)
    out += ", data parallel " + std::to_string(mesh.dp) + ", ZeRO stage " + std::to_string(stage);
  out += "\n";
  if (dev.device == Device::CPU) out += "BLAS: " + cpu::blas_core_summary() + "\n";
  return out;
}

std::string format_memory_report(const Config& cfg, const MemoryPlan& plan, const DeviceChoice& dev, DType storage,
                                 const MeshShape& mesh, const Coords& at) {
  const int stage = cfg.parallel.zero_stage;
  std::string out = format_memory_plan(plan, device_name(dev.device), storage);
  if (mesh.dp > 1) out += format_zero_stages(cfg, storage, mesh, at, stage);
  out += format_sp_activations(cfg, storage, mesh, at, stage);
  out += format_recompute_trade(cfg, storage, mesh, at, stage);
  return out;
}

std::string format_model_line(const Config& cfg, const ModelDims& dims) {
  std::string extra = dims.E > 0 ? ", MoE " + std::to_string(dims.E) + " experts top-" + std::to_string(dims.K) : "";
  if (dims.window > 0)
    extra += ", sliding window " + std::to_string(dims.window) +
             (dims.window >= cfg.train.seq_len - 1 ? " (covers train.seq_len: full causal attention)" : "");
  char buf[512];
  std::snprintf(buf, sizeof buf, "model: %s, %lld layers, d_model %lld, heads %lld/%lld, ffn %lld%s\n",
                cfg.model.arch.c_str(), (long long)dims.L, (long long)dims.C, (long long)dims.Hq, (long long)dims.Hkv,
                (long long)dims.F, extra.c_str());
  return buf;
}

std::string format_batch_line(const Config& cfg, int64_t M) {
  const int64_t T = cfg.train.seq_len;
  char buf[256];
  std::snprintf(buf, sizeof buf, "batch: %lld sequences x %lld tokens = %lld tokens/step (%lld micro-batch%s of %lld)\n",
                (long long)cfg.train.global_batch_size, (long long)T, (long long)(cfg.train.global_batch_size * T),
                (long long)M, M == 1 ? "" : "es", (long long)cfg.train.micro_batch_size);
  return buf;
}

std::string format_layout_report(const Config& cfg, const ModelDims& dims, const std::vector<int64_t>& stage_layers,
                                 const Schedule& schedule, const Simulation& simulated, DType storage,
                                 const MeshShape& mesh, const std::vector<ShardingPlan>& plans, int64_t M) {
  std::string out;
  if (mesh.pp > 1) out += format_pipeline(cfg, dims, stage_layers, schedule, simulated, storage, mesh);
  out += format_tp_traffic(tp_traffic(plans, M));
  if (dims.E > 0) out += format_moe_routing(plans.front().local, cfg.model.moe.capacity_factor, mesh.dp);
  if (mesh.ep > 1) out += format_expert_layout(expert_layout(plans), M);
  if (mesh.cp > 1) out += format_context_report(plans.front(), M);
  return out;
}

void check_allocation(const MemoryPlan& plan, size_t param_bytes, size_t grad_bytes, size_t optimizer_bytes,
                      size_t host_bytes) {
  if (optimizer_bytes == plan.optimizer_bytes && param_bytes == plan.param_bytes && grad_bytes == plan.grad_bytes &&
      host_bytes == plan.host_bytes)
    return;
  throw std::logic_error("memory plan and allocation disagree: parameters " + std::to_string(plan.param_bytes) +
                         " planned, " + std::to_string(param_bytes) + " allocated; gradients " +
                         std::to_string(plan.grad_bytes) + " / " + std::to_string(grad_bytes) + "; optimizer " +
                         std::to_string(plan.optimizer_bytes) + " / " + std::to_string(optimizer_bytes) +
                         "; host (ZeRO-Offload) " + std::to_string(plan.host_bytes) + " / " + std::to_string(host_bytes));
}

std::string format_allocation_line(const MemoryPlan& plan) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "memory plan = allocation: parameters %zu, gradients %zu, optimizer %zu bytes%s\n",
                plan.param_bytes, plan.grad_bytes, plan.optimizer_bytes,
                plan.offload ? (", host (ZeRO-Offload) " + std::to_string(plan.host_bytes) + " bytes").c_str() : "");
  return buf;
}

std::string format_tokenizer_line(const TokenizerFiles& files, const Config& cfg, const std::string& run_dir) {
  const std::unique_ptr<Tokenizer> t = load_tokenizer(files);
  std::string out = "tokenizer: " + files.kind + (files.file.empty() ? "" : " ") + files.file + ", vocabulary " +
                    std::to_string(t->vocab_size() > 0 ? t->vocab_size() : files.info_vocab) + " (model.vocab_size " +
                    std::to_string(cfg.model.vocab_size) + "), copied to " + run_dir + "/tokenizer/\n";
  if (!t->warning.empty()) out += "warning: " + t->warning + "\n";
  return out;
}

}  // namespace trainer
