#include "trainer/smoke_roundtrip.h"

#include <cstdio>
#include <exception>

#include "checkpoint/checkpoint.h"
#include "kernels/ops.h"
#include "optim/adamw.h"
#include "trainer/checkpointing.h"

namespace trainer {

void check_roundtrip(const Config& cfg, const ShardingPlan& plan, Model& m, const ZeroOptimizer& opt, int64_t step,
                     int64_t tokens,
                     const std::string& root, const LaunchInfo& launch, DistributedRun& dist, TrainSummary& sum) {
  sum.roundtrip_checked = true;
  bool ok = false;
  try {
    CheckpointWriter w(root, 0, false,
                       CheckpointGroup{dist.store(), launch.rank, launch.world_size, cfg.parallel.timeout_s});
    Snapshot snap = take_snapshot(cfg, m, opt, step, tokens, launch.rank, launch.world_size);
    w.save(snap);
    const LoadedCheckpoint ck = load_checkpoint(w.last_completed(), shard_filter(m, opt));
    size_t same = 0;
    for (const ShardTensor& t : snap.tensors)
      for (const ShardTensor& u : ck.tensors)
        if (u.name == t.name && u.slice == t.slice && u.data == t.data) ++same;
    Model m2;
    build_model(m2, plan, model_device(m), zero_model_storage(opt.stage()));
    m2.tp = m.tp;
    ZeroOptimizer opt2(m2, opt.stage(), dist.dp_group(), dist.host(), adamw_config(cfg));
    m2.hooks = &opt2;
    restore_checkpoint(ck, m2, opt2);
    ops::copy(m2.acts.ids, m.acts.ids);
    ops::copy(m2.acts.targets, m.acts.targets);
    const double n = double(m.dims.N());
    const double l1 = model_forward(m, 0.f).loss_sum / n, l2 = model_forward(m2, 0.f).loss_sum / n;
    ok = same == snap.tensors.size() && l1 == l2 && opt2.optimizer_step() == opt.optimizer_step();
    char buf[256];
    std::snprintf(buf, sizeof buf, "%zu/%zu tensors identical after save -> load, loss %.6f vs %.6f after restore%s",
                  same, snap.tensors.size(), l1, l2,
                  launch.world_size > 1 ? (" (rank " + std::to_string(launch.rank) + ")").c_str() : "");
    sum.roundtrip_detail = buf;
  } catch (const std::exception& e) {
    sum.roundtrip_detail = e.what();
  }
  double failed = ok ? 0 : 1;
  dist.host().all_reduce(Tensor(&failed, DType::F64, {1}));
  sum.roundtrip_ok = failed == 0;
  if (ok && failed > 0) sum.roundtrip_detail += "; but it failed on " + std::to_string(int64_t(failed)) + " other rank(s)";
}

}  // namespace trainer
