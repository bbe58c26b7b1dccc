#include "trainer/checkpointing.h"

#include <cstdio>

#include "core/device_memory.h"

namespace trainer {

namespace {

constexpr const char* kKinds[] = {"model/", "optim/m/", "optim/v/"};

// A ZeRO piece: elements [begin, begin + count) of the whole, unsplit
// tensor; the whole tensor when it holds all of them.
SliceSpec piece_slice(const ParamInfo& p, int64_t begin, int64_t count) {
  SliceSpec s = SliceSpec::whole(p.spec.shape);
  if (begin == 0 && count == p.spec.numel()) return s;
  return s.flat_range(begin, begin + count);
}

ShardTensor piece_tensor(const std::string& name, const ParamInfo& p, const ZeroPiece& z, const Tensor& src) {
  ShardTensor s;
  s.name = name;
  s.dtype = DType::F32;
  s.slice = piece_slice(p, z.begin, z.count);
  s.data.resize(size_t(z.count) * 4);
  read_to_host(src, s.data.data());  // device tensors come back through one copy
  return s;
}

}  // namespace

SliceFilter shard_filter(const Model& m, const ZeroOptimizer& opt) {
  std::vector<std::pair<std::string, SliceSpec>> wanted;
  for (const ZeroPiece& z : opt.own_pieces()) {
    const ParamInfo& p = m.params[size_t(z.param)];
    for (const char* kind : kKinds) wanted.emplace_back(kind + p.spec.name, piece_slice(p, z.begin, z.count));
  }
  return overlapping(wanted);
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
  const SliceAssembler saved(ck);
  auto read = [&](const std::string& what, int param, int64_t begin, int64_t count, float* dst) {
    const ParamInfo& p = m.params[size_t(param)];
    saved.fill(what + "/" + p.spec.name, DType::F32, piece_slice(p, begin, count), dst);
  };
  opt.load(read, true);
  opt.set_optimizer_step(ck.meta.optimizer_step);
}

}  // namespace trainer
