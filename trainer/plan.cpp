#include "trainer/plan.h"

#include <cstdio>

#include "model/activations.h"
#include "model/params.h"
#include "optim/adamw.h"

namespace trainer {

MemoryPlan plan_memory(const Config& c, DType storage) {
  const ModelDims d = make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
  const auto params = parameter_list(d, c.model.init_std);
  MemoryPlan p;
  p.parameters = parameter_count(params);
  p.param_bytes = arena_bytes(specs_of(params));
  p.grad_bytes = p.param_bytes;
  p.optimizer_bytes = adamw_state_bytes(params);
  p.activation_bytes = arena_bytes(activation_specs(d));
  p.workspace_bytes = arena_bytes(grad_scratch_specs(d));
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

std::string format_plan(const MemoryPlan& p, const std::string& device_label, DType storage) {
  const char* st = dtype_name(storage);
  const bool mixed = storage != DType::F32;
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "memory plan per rank (%s), %.3fM parameters:\n"
                "  parameters   %12s  (%s)\n"
                "  gradients    %12s  (%s)\n"
                "  optimizer    %12s  (AdamW m, v%s, F32)\n"
                "  activations  %12s  (one micro-batch, saved for backward)\n"
                "  workspace    %12s  (backward scratch)\n"
                "  total        %12s\n",
                device_label.c_str(), double(p.parameters) / 1e6,
                format_bytes(double(p.param_bytes)).c_str(), st,
                format_bytes(double(p.grad_bytes)).c_str(), st,
                format_bytes(double(p.optimizer_bytes)).c_str(), mixed ? ", master weights" : "",
                format_bytes(double(p.activation_bytes)).c_str(),
                format_bytes(double(p.workspace_bytes)).c_str(),
                format_bytes(double(p.total())).c_str());
  return buf;
}

}  // namespace trainer
