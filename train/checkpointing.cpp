#include "train/checkpointing.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "config/config_schema.h"
#include "core/device_memory.h"

namespace trainer {

namespace {

constexpr const char* kKinds[] = {"model/", "optim/m/", "optim/v/"};

// Elements [begin, begin + count) of this rank's slice of a parameter, in
// global terms: the slice's box in the global tensor (a tensor-parallel
// block of rows or columns, or all of it), and the ZeRO piece's flat range
// of that box when it does not hold the whole box. Padding past the box (a
// vocabulary tp does not divide) is left out: the count shrinks, possibly
// to nothing.
SliceSpec piece_slice(const ParamInfo& p, int64_t begin, int64_t& count) {
  const SliceSpec box = SliceSpec::box(p.global_shape, p.offset, p.box_shape);
  count = std::max<int64_t>(0, std::min(begin + count, p.box_numel()) - begin);
  if (begin == 0 && count == p.box_numel()) return box;
  return box.flat_range(begin, begin + count);
}

ShardTensor piece_tensor(const std::string& name, const ParamInfo& p, const ZeroPiece& z, const std::vector<float>& host) {
  ShardTensor s;
  s.name = name;
  s.dtype = DType::F32;
  int64_t count = z.count;
  s.slice = piece_slice(p, z.begin, count);
  s.data.resize(size_t(count) * 4);
  std::memcpy(s.data.data(), host.data(), s.data.size());
  return s;
}

}  // namespace

SliceFilter shard_filter(const std::vector<ChunkState>& chunks) {
  std::vector<std::pair<std::string, SliceSpec>> wanted;
  for (const ChunkState& c : chunks)
    for (const ZeroPiece& z : c.opt->own_pieces()) {
      const ParamInfo& p = c.model->params[size_t(z.param)];
      int64_t count = z.count;
      const SliceSpec slice = piece_slice(p, z.begin, count);
      if (count == 0) continue;
      for (const char* kind : kKinds) wanted.emplace_back(kind + p.spec.name, slice);
    }
  return overlapping(wanted);
}

std::optional<LoadedCheckpoint> load_resume_checkpoint(const std::string& root, const std::string& mode,
                                                       const std::vector<ChunkState>& chunks, Communicator& host,
                                                       bool lead, bool healthy_only, int64_t trusted) {
  ResumeFilter pass_over;
  if (healthy_only)
    pass_over = [trusted](const CheckpointMeta& m) -> std::string {
      if (m.verdict != kVerdictUnconfirmed || m.step == trusted) return "";
      return "verdict \"unconfirmed\" (the last step's or a preemption's save: no step had run on its state)";
    };
  return resolve_resume(root, mode, shard_filter(chunks), [&](const std::string& dir, bool loaded_here) {
    double failed = loaded_here ? 0 : 1;
    host.all_reduce(Tensor(&failed, DType::F64, {1}));
    // Ranks where it failed say why themselves; rank 0 says that it is skipped.
    if (loaded_here && failed > 0 && lead && mode == "auto")
      std::fprintf(stderr, "checkpoint: skipping %s: failed to load on %lld other rank(s) (see their messages)\n",
                   dir.c_str(), (long long)failed);
    return int64_t(failed);
  }, pass_over);
}

std::string checkpoint_root(const Config& cfg) {
  return cfg.checkpoint.dir.empty() ? cfg.run_dir() + "/ckpt" : cfg.checkpoint.dir;
}

std::string layout_string(const Config& c, int dp) {
  const auto& p = c.parallel;
  return "tp" + std::to_string(p.tp) + ".pp" + std::to_string(p.pp) + ".dp" + std::to_string(dp) + ".cp" +
         std::to_string(p.cp) + ".ep" + std::to_string(p.ep) + ".zero" + std::to_string(p.zero_stage);
}

Snapshot take_snapshot(const Config& cfg, const std::vector<ChunkState>& chunks, int64_t step, int64_t tokens,
                       int rank, int world_size) {
  Snapshot s;
  s.meta.step = step;
  s.meta.tokens = tokens;
  s.meta.seed = cfg.run.seed;
  s.meta.optimizer_step = chunks.front().opt->optimizer_step();  // every chunk steps together
  s.meta.config_yaml = config_to_yaml(cfg);
  s.meta.world_size = world_size;
  s.meta.layout = layout_string(cfg, data_parallel_size(cfg, world_size));
  s.rank = rank;
  std::vector<float> host;
  for (const ChunkState& c : chunks) {
    const Model& m = *c.model;
    const ZeroOptimizer& opt = *c.opt;
    for (const ZeroPiece& z : opt.save_pieces()) {
      const ParamInfo& p = m.params[size_t(z.param)];
      // One copy of replicas (tp rank 0's copy of a tensor tp does not cut,
      // the first stage's of a tied table); nothing of pure padding.
      int64_t count = z.count;
      piece_slice(p, z.begin, count);
      if (!m.placement[size_t(z.param)].saved || count == 0) continue;
      // fp32 always: the master copy under mixed precision, so a checkpoint
      // written on a GPU in bf16 resumes on a CPU (and back) without loss.
      host.resize(size_t(z.count));
      const std::pair<const char*, Tensor> kinds[] = {
          {"model/", opt.fp32_weight(z)}, {"optim/m/", opt.moment_m(z)}, {"optim/v/", opt.moment_v(z)}};
      for (const auto& [kind, src] : kinds) {
        read_to_host(src, host.data());  // device tensors come back through one copy
        s.tensors.push_back(piece_tensor(kind + p.spec.name, p, z, host));
      }
    }
  }
  return s;
}

void restore_checkpoint(const LoadedCheckpoint& ck, const std::vector<ChunkState>& chunks) {
  const SliceAssembler saved(ck);
  for (const ChunkState& c : chunks) {
    Model& m = *c.model;
    auto read = [&](const std::string& what, int param, int64_t begin, int64_t count, float* dst) {
      const ParamInfo& p = m.params[size_t(param)];
      int64_t inside = count;
      const SliceSpec slice = piece_slice(p, begin, inside);
      if (inside > 0) saved.fill(what + "/" + p.spec.name, DType::F32, slice, dst);
      std::fill(dst + inside, dst + count, 0.f);  // vocabulary padding stays zero
    };
    c.opt->load(read, true);
    c.opt->set_optimizer_step(ck.meta.optimizer_step);
  }
}

}  // namespace trainer
