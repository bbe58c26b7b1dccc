#include "train/stage_models.h"

#include <algorithm>

namespace trainer {

StageModels::StageModels(const std::vector<ShardingPlan>& plans, Device device, int zero_stage,
                         const std::vector<int>& slots, const StageGroups& groups, const AdamWConfig& cfg) {
  for (size_t c = 0; c < plans.size(); ++c) {
    auto chunk = std::make_unique<Chunk>();
    build_model(chunk->model, plans[c], device, zero_model_storage(zero_stage));
    chunk->model.tp = groups.tp;
    chunk->model.ep = groups.ep;
    chunk->model.cp = groups.cp;
    reserve_activation_slots(chunk->model, slots[c]);
    chunk->zero = std::make_unique<ZeroOptimizer>(chunk->model, zero_stage, *groups.dp,
                                                  groups.edp ? *groups.edp : *groups.dp, *groups.host, cfg);
    chunk->zero->set_pipeline(groups.pp);
    chunk->model.hooks = chunk->zero.get();
    chunks_.push_back(std::move(chunk));
  }
}

StageGroups stage_groups(DistributedRun& dist) {
  return StageGroups{&dist.tp_group(), &dist.dp_group(), &dist.host(), &dist.pp_group(), &dist.ep_group(),
                     &dist.edp_group(), &dist.cp_group()};
}

std::vector<Model*> StageModels::models() {
  std::vector<Model*> out;
  for (auto& c : chunks_) out.push_back(&c->model);
  return out;
}

std::vector<ChunkState> StageModels::states() {
  std::vector<ChunkState> out;
  for (auto& c : chunks_) out.push_back({&c->model, c->zero.get()});
  return out;
}

void StageModels::initialise(uint64_t seed) {
  for (auto& c : chunks_) {
    const std::vector<ParamInfo>& params = c->model.params;
    c->zero->load([&](const std::string&, int param, int64_t begin, int64_t count, float* dst) {
      initial_values(params[size_t(param)], seed, begin, count, dst);
    }, false);
  }
}

void StageModels::initialise_from(const TensorMap& weights) {
  for (auto& c : chunks_) {
    const std::vector<ParamInfo>& params = c->model.params;
    c->zero->load([&](const std::string&, int param, int64_t begin, int64_t count, float* dst) {
      const ParamInfo& p = params[size_t(param)];
      const HostTensor& whole = weights.at(p.spec.name);
      std::fill(dst, dst + count, 0.f);  // padding rows (a vocabulary tp does not divide) stay zero
      for_each_global_run(p, begin, count, [&](int64_t local, int64_t global, int64_t n) {
        std::copy_n(whole.data.data() + global, n, dst + (local - begin));
      });
    }, false);
  }
}

void StageModels::begin_step() {
  for (auto& c : chunks_) c->zero->begin_step();
}

void StageModels::finish_backward() {
  for (auto& c : chunks_) c->zero->finish_backward();
}

double StageModels::grad_sum_squares() {
  double s = 0;
  for (auto& c : chunks_) s += c->zero->grad_sum_squares();
  return s;
}

std::string StageModels::first_nonfinite_gradient(const std::vector<ParamInfo>& global, Communicator& host) {
  // Each rank's first, as a place in the global order; the earliest wins.
  double best = 0;  // global.size() - index, 0: none
  for (auto& c : chunks_) {
    const std::string name = c->zero->first_nonfinite_gradient();
    for (size_t i = 0; i < global.size() && !name.empty(); ++i)
      if (global[i].spec.name == name) best = std::max(best, double(global.size() - i));
  }
  if (host.size() > 1) host.all_reduce(Tensor(&best, DType::F64, {1}), ReduceOp::Max);
  return best > 0 ? global[global.size() - size_t(best)].spec.name : "";
}

double StageModels::local_grad_sum_squares() const {
  double s = 0;
  for (const auto& c : chunks_) s += c->zero->local_sum_squares();
  return s;
}

void StageModels::set_gradient_fingerprint(bool on) {
  for (auto& c : chunks_) c->zero->set_gradient_fingerprint(on);
}

double StageModels::gradient_fingerprint() const {
  double s = 0;
  for (const auto& c : chunks_) s += c->zero->gradient_fingerprint();
  return s;
}

void StageModels::step(double lr, double grad_scale) {
  for (auto& c : chunks_) c->zero->step(lr, grad_scale);
}

size_t StageModels::param_bytes() const {
  size_t b = 0;
  for (const auto& c : chunks_) b += c->zero->param_bytes();
  return b;
}

size_t StageModels::grad_bytes() const {
  size_t b = 0;
  for (const auto& c : chunks_) b += c->zero->grad_bytes();
  return b;
}

size_t StageModels::optimizer_bytes() const {
  size_t b = 0;
  for (const auto& c : chunks_) b += c->zero->optimizer_bytes();
  return b;
}

size_t StageModels::host_bytes() const {
  size_t b = 0;
  for (const auto& c : chunks_) b += c->zero->host_bytes();
  return b;
}

std::vector<std::vector<float>> StageModels::gather_fp32_weights(const std::vector<ParamInfo>& global) {
  std::vector<std::vector<float>> all;
  for (auto& c : chunks_) {
    // Each chunk's pieces are disjoint from the others': the sums add up.
    auto part = c->zero->gather_fp32_weights(global);
    if (all.empty()) {
      all = std::move(part);
      continue;
    }
    for (size_t i = 0; i < all.size(); ++i)
      for (size_t j = 0; j < all[i].size(); ++j) all[i][j] += part[i][j];
  }
  return all;
}

}  // namespace trainer
