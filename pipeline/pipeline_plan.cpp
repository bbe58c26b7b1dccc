#include "pipeline/pipeline_plan.h"

#include <algorithm>

#include "pipeline/stage_split.h"

namespace trainer {

std::vector<int64_t> stage_layers_for(const Config& c, const ModelDims& global, int stages) {
  if (!c.parallel.pp_layers.empty()) return {c.parallel.pp_layers.begin(), c.parallel.pp_layers.end()};
  if (stages == 1) return {global.layers_total()};
  return balanced_stage_layers(global, stages);
}

std::vector<ActionCosts> stage_action_costs(const ModelDims& global, const std::vector<int64_t>& layers) {
  const std::vector<double> f = stage_flops(global, layers);
  const double top = *std::max_element(f.begin(), f.end());
  std::vector<ActionCosts> out;
  for (double x : f) {
    ActionCosts c;
    c.forward = x / top;
    c.backward = 2 * c.forward;
    c.backward_input = c.backward_weight = c.forward;
    out.push_back(c);
  }
  return out;
}

int64_t microbatches_per_step(const Config& c, int dp) {
  return c.train.global_batch_size / (c.train.micro_batch_size * int64_t(dp));
}

}  // namespace trainer
