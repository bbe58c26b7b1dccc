#include "trainer/checkpointing.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <unordered_map>

#include "core/device_memory.h"

namespace trainer {

namespace {

ShardTensor piece_tensor(const std::string& name, const ParamInfo& p, const ZeroPiece& z, const Tensor& src) {
  ShardTensor s;
  s.name = name;
  s.dtype = DType::F32;
  if (z.begin == 0 && z.count == p.spec.numel()) {
    s.global_shape = s.shape = p.spec.shape;
    s.offset.assign(p.spec.shape.size(), 0);
  } else {
    s.global_shape = {p.spec.numel()};
    s.shape = {z.count};
    s.offset = {z.begin};
  }
  s.data.resize(size_t(z.count) * 4);
  read_to_host(src, s.data.data());  // device tensors come back through one copy
  return s;
}

bool whole(const ShardTensor& s) {
  for (size_t d = 0; d < s.shape.size(); ++d)
    if (s.offset[d] != 0 || s.shape[d] != s.global_shape[d]) return false;
  return true;
}

// Elements [begin, begin + count) of the flattened tensor from one saved
// slice: a flattened piece or a whole tensor. Returns the elements copied.
int64_t copy_flat(const ShardTensor& src, int64_t begin, int64_t count, float* dst, const std::string& where) {
  int64_t lo = 0, n = 0;
  if (src.global_shape.size() == 1) {
    lo = src.offset[0];
    n = src.shape[0];
  } else if (whole(src)) {
    n = int64_t(src.data.size() / 4);
  } else {
    throw std::runtime_error(where + ": saved as a multi-dimensional slice (tensor parallel), which a "
                                     "data-parallel layout cannot read");
  }
  const int64_t a = std::max(lo, begin), b = std::min(lo + n, begin + count);
  if (a >= b) return 0;
  std::memcpy(dst + (a - begin), src.data.data() + (a - lo) * 4, size_t(b - a) * 4);
  return b - a;
}

}  // namespace

SliceFilter shard_filter(const Model& m, const ZeroOptimizer& opt) {
  // Per parameter, the flat element range this rank needs ([0, 0): none).
  std::unordered_map<std::string, std::pair<int64_t, int64_t>> need;
  for (const ZeroPiece& z : opt.own_pieces()) need[m.params[size_t(z.param)].spec.name] = {z.begin, z.begin + z.count};
  return [need = std::move(need)](const std::string& name, const std::vector<int64_t>& global,
                                  const std::vector<int64_t>& offset, const std::vector<int64_t>& shape) {
    std::string param;
    for (const char* prefix : {"model/", "optim/m/", "optim/v/"})
      if (name.rfind(prefix, 0) == 0) param = name.substr(std::strlen(prefix));
    const auto it = need.find(param);
    if (it == need.end()) return false;
    int64_t lo = 0, hi = 1;
    if (global.size() == 1) {
      lo = offset[0];
      hi = offset[0] + shape[0];
    } else {
      for (int64_t d : global) hi *= d;
      for (size_t d = 0; d < shape.size(); ++d)
        if (offset[d] != 0 || shape[d] != global[d]) return true;  // a tensor-parallel box: let restore judge it
    }
    return lo < it->second.second && it->second.first < hi;
  };
}

std::optional<LoadedCheckpoint> load_resume_checkpoint(const std::string& root, const std::string& mode,
                                                       const Model& m, const ZeroOptimizer& opt, Communicator& host,
                                                       bool lead) {
  return resolve_resume(root, mode, shard_filter(m, opt), [&](const std::string& dir, bool loaded_here) {
    double failed = loaded_here ? 0 : 1;
    host.all_reduce(Tensor(&failed, DType::F64, {1}));
    // Ranks where it failed say why themselves; rank 0 says that it is skipped.
    if (loaded_here && failed > 0 && lead && mode == "auto")
      std::fprintf(stderr, "checkpoint: skipping %s: failed to load on %lld other rank(s) (see their messages)\n",
                   dir.c_str(), (long long)failed);
    return int64_t(failed);
  });
}

std::string checkpoint_root(const Config& cfg) {
  return cfg.checkpoint.dir.empty() ? cfg.run_dir() + "/ckpt" : cfg.checkpoint.dir;
}

std::string layout_string(const Config& c, int dp) {
  const auto& p = c.parallel;
  return "tp" + std::to_string(p.tp) + ".pp" + std::to_string(p.pp) + ".dp" + std::to_string(dp) + ".cp" +
         std::to_string(p.cp) + ".ep" + std::to_string(p.ep) + ".zero" + std::to_string(p.zero_stage);
}

Snapshot take_snapshot(const Config& cfg, const Model& m, const ZeroOptimizer& opt, int64_t step, int64_t tokens,
                       int rank, int world_size) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = tokens;
  s.meta.seed = cfg.run.seed;
  s.meta.optimizer_step = opt.optimizer_step();
  s.meta.config_yaml = config_to_yaml(cfg);
  s.meta.world_size = world_size;
  s.meta.layout = layout_string(cfg, world_size);
  s.rank = rank;
  for (const ZeroPiece& z : opt.save_pieces()) {
    const ParamInfo& p = m.params[size_t(z.param)];
    // fp32 always: the master copy under mixed precision, so a checkpoint
    // written on a GPU in bf16 resumes on a CPU (and back) without loss.
    s.tensors.push_back(piece_tensor("model/" + p.spec.name, p, z, opt.fp32_weight(z)));
    s.tensors.push_back(piece_tensor("optim/m/" + p.spec.name, p, z, opt.moment_m(z)));
    s.tensors.push_back(piece_tensor("optim/v/" + p.spec.name, p, z, opt.moment_v(z)));
  }
  return s;
}

void restore_checkpoint(const LoadedCheckpoint& ck, Model& m, ZeroOptimizer& opt) {
  std::unordered_multimap<std::string, const ShardTensor*> by_name;
  for (const ShardTensor& t : ck.tensors) by_name.emplace(t.name, &t);
  auto read = [&](const std::string& what, int param, int64_t begin, int64_t count, float* dst) {
    const ParamInfo& p = m.params[size_t(param)];
    const std::string name = what + "/" + p.spec.name;
    const std::string where = ck.dir + ": tensor '" + name + "'";
    auto [lo, hi] = by_name.equal_range(name);
    if (lo == hi)
      throw std::runtime_error(ck.dir + ": checkpoint has no tensor '" + name +
                               "' (was it saved from a different model configuration?)");
    int64_t copied = 0;
    for (auto it = lo; it != hi; ++it) {
      const ShardTensor& src = *it->second;
      int64_t numel = 1;
      for (int64_t d : src.global_shape) numel *= d;
      if (numel != p.spec.numel() || src.dtype != DType::F32)
        throw std::runtime_error(where + " has " + std::to_string(p.spec.numel()) +
                                 " elements (F32) in this model but a different size or dtype in the checkpoint");
      copied += copy_flat(src, begin, count, dst, where);
    }
    if (copied != count)
      throw std::runtime_error(where + ": the saved slices cover " + std::to_string(copied) + " of the " +
                               std::to_string(count) + " elements this rank needs");
  };
  opt.load(read, true);
  opt.set_optimizer_step(ck.meta.optimizer_step);
}

}  // namespace trainer
