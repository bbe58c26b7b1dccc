#include "trainer/checkpointing.h"

#include <cstring>

#include "kernels/device_memory.h"
#include "kernels/ops.h"
#include <stdexcept>
#include <unordered_map>

namespace trainer {

namespace {

ShardTensor shard_of(const std::string& name, const Tensor& t) {
  ShardTensor s;
  s.name = name;
  s.dtype = t.dtype;
  for (int i = 0; i < t.ndim; ++i) {
    s.global_shape.push_back(t.shape[i]);
    s.shape.push_back(t.shape[i]);
    s.offset.push_back(0);
  }
  s.data.resize(t.nbytes());
  read_to_host(t, s.data.data());  // device tensors come back through one copy
  return s;
}

std::string layout_string(const Config& c) {
  const auto& p = c.parallel;
  return "tp" + std::to_string(p.tp) + ".pp" + std::to_string(p.pp) + ".dp" +
         std::to_string(p.dp > 0 ? p.dp : 1) + ".cp" + std::to_string(p.cp) + ".ep" +
         std::to_string(p.ep) + ".zero" + std::to_string(p.zero_stage);
}

}  // namespace

std::string checkpoint_root(const Config& cfg) {
  return cfg.checkpoint.dir.empty() ? cfg.run_dir() + "/ckpt" : cfg.checkpoint.dir;
}

Snapshot take_snapshot(const Config& cfg, const Model& m, const AdamWState& opt, int64_t step,
                       int64_t tokens) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = tokens;
  s.meta.seed = cfg.run.seed;
  s.meta.optimizer_step = opt.step;
  s.meta.config_yaml = config_to_yaml(cfg);
  s.meta.world_size = 1;
  s.meta.layout = layout_string(cfg);
  s.rank = 0;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const std::string& n = m.params[i].spec.name;
    // fp32 always: the master copy under mixed precision, so a checkpoint
    // written on a GPU in bf16 resumes on a CPU (and back) without loss.
    s.tensors.push_back(shard_of("model/" + n, fp32_weight(opt, m.param_tensors, i)));
    s.tensors.push_back(shard_of("optim/m/" + n, opt.m[i]));
    s.tensors.push_back(shard_of("optim/v/" + n, opt.v[i]));
  }
  return s;
}

void restore_checkpoint(const LoadedCheckpoint& ck, Model& m, AdamWState& opt) {
  std::unordered_multimap<std::string, const ShardTensor*> by_name;
  for (const ShardTensor& t : ck.tensors) by_name.emplace(t.name, &t);
  auto fill = [&](const std::string& name, const Tensor& dst) {
    std::vector<int64_t> shape(dst.shape.begin(), dst.shape.begin() + dst.ndim);
    std::vector<int64_t> offset(size_t(dst.ndim), 0);
    std::vector<char> host(dst.nbytes());
    auto [lo, hi] = by_name.equal_range(name);
    if (lo == hi)
      throw std::runtime_error(ck.dir + ": checkpoint has no tensor '" + name +
                               "' (was it saved from a different model configuration?)");
    int64_t copied = 0;
    for (auto it = lo; it != hi; ++it) {
      const ShardTensor& src = *it->second;
      if (src.global_shape != shape || src.dtype != dst.dtype)
        throw std::runtime_error(ck.dir + ": tensor '" + name + "' has global shape " +
                                 dst.shape_str() + " in this model but a different shape or dtype in the checkpoint");
      copied += copy_overlap(src, offset, shape, host.data());
    }
    if (copied != dst.numel())
      throw std::runtime_error(ck.dir + ": tensor '" + name + "': the saved slices cover " +
                               std::to_string(copied) + " of " + std::to_string(dst.numel()) +
                               " elements");
    write_from_host(dst, host.data());
  };
  for (size_t i = 0; i < m.params.size(); ++i) {
    const std::string& n = m.params[i].spec.name;
    const Tensor w = fp32_weight(opt, m.param_tensors, i);
    fill("model/" + n, w);
    if (opt.mixed()) ops::convert(m.param_tensors[i], w);
    fill("optim/m/" + n, opt.m[i]);
    fill("optim/v/" + n, opt.v[i]);
  }
  opt.step = ck.meta.optimizer_step;
}

}  // namespace trainer
