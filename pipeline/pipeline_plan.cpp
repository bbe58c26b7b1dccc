#include "pipeline/pipeline_plan.h"

#include <algorithm>

#include "pipeline/stage_split.h"

namespace trainer {

std::vector<int64_t> stage_layers_for(const Config& c, const ModelDims& global, int stages) {
  if (!c.parallel.pp_layers.empty()) return {c.parallel.pp_layers.begin(), c.parallel.pp_layers.end()};
  if (stages == 1) return {global.layers_total()};
  return balanced_stage_layers(global, stages);
}

std::vector<ActionCosts> stage_action_costs(const ModelDims& global, const std::vector<int64_t>& layers, int ranks) {
  const std::vector<double> f = stage_flops(global, layers);
  const double top = *std::max_element(f.begin(), f.end());
  std::vector<ActionCosts> out;
  for (int r = 0; r < ranks; ++r) {
    double x = 0;
    int n = 0;
    for (size_t k = size_t(r); k < f.size(); k += size_t(ranks), ++n) x += f[k];
    x /= double(n > 0 ? n : 1);
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

int pipeline_chunks(const Config& c) { return c.parallel.pp_schedule == "interleaved" ? c.parallel.pp_virtual : 1; }

std::vector<ShardingPlan> chunk_plans(const ModelDims& global, double init_std, const MeshShape& mesh, const Coords& at,
                                      int zero_stage, bool sp, const std::vector<int64_t>& layers, int chunks) {
  MeshShape virtual_mesh = mesh;
  virtual_mesh.pp = mesh.pp * chunks;
  std::vector<ShardingPlan> out;
  for (int k = 0; k < chunks; ++k) {
    Coords v = at;
    v.pp = k * mesh.pp + at.pp;
    out.push_back(make_sharding_plan(global, init_std, virtual_mesh, v, zero_stage, sp, layers));
  }
  return out;
}

Schedule schedule_for(const Config& c, int stages, int64_t microbatches) {
  return make_schedule(parse_schedule(c.parallel.pp_schedule), stages, int(microbatches), pipeline_chunks(c));
}

TransferMode transfer_mode_for(const Config& c, Device d) {
  TransferMode m;
  m.nonblocking_sends = m.early_receives = c.parallel.overlap && d == Device::CPU;
  return m;
}

TransferMode planned_transfer_mode(const Config& c) {
  return transfer_mode_for(c, c.train.device == "cpu" ? Device::CPU : Device::CUDA);
}

}  // namespace trainer
