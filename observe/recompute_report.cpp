#include "observe/recompute_report.h"

#include "planner/memory_plan.h"

namespace trainer {

std::string format_recompute_trade(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                                   int zero_stage) {
  std::string line = "  recompute (activations + workspace):";
  const char* const modes[] = {"none", "selective", "full"};
  for (const char* mode : modes) {
    Config with = c;
    with.train.recompute = mode;
    const MemoryPlan p = plan_memory(with, storage, mesh, at, zero_stage);
    line += std::string(mode == modes[0] ? " " : " | ") + mode + " " +
            format_bytes(double(p.activation_bytes + p.workspace_bytes));
  }
  std::string layers;
  if (c.train.recompute != "none" && c.train.recompute_layers > 0)
    layers = ", first " + std::to_string(c.train.recompute_layers) + " layer(s) of each stage";
  return line + " (this run: " + c.train.recompute + layers + ")\n";
}

}  // namespace trainer
