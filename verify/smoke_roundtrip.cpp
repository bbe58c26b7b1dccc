#include "verify/smoke_roundtrip.h"

#include <cstdio>
#include <exception>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/device_memory.h"
#include "pipeline/executor.h"
#include "optim/adamw.h"
#include "train/checkpointing.h"

namespace trainer {

void check_roundtrip(const FinishedRun& run, TrainSummary& sum) {
  const Config& cfg = run.cfg;
  const LaunchInfo& launch = run.launch;
  const std::vector<ShardingPlan>& plans = run.plans;
  StageModels& models = run.models;
  DistributedRun& dist = run.dist;
  const int64_t step = run.step, tokens = run.tokens;
  const std::string root = run.checkpoint_root + "/roundtrip";
  sum.roundtrip_checked = true;
  bool ok = false;
  size_t same = 0, total = 0;
  double losses[2] = {0, 0};  // before and after the restore
  std::string error;
  try {
    CheckpointWriter w(root, 0, false,
                       CheckpointGroup{dist.store(), launch.rank, launch.world_size, cfg.parallel.timeout_s, {}});
    Snapshot snap = take_snapshot(cfg, models.states(), step, tokens, launch.rank, launch.world_size);
    w.save(snap);
    const LoadedCheckpoint ck = load_checkpoint(w.last_completed(), shard_filter(models.states()));
    total = snap.tensors.size();
    for (const ShardTensor& t : snap.tensors)
      for (const ShardTensor& u : ck.tensors)
        if (u.name == t.name && u.slice == t.slice && u.data == t.data) ++same;
    Model& m = models.model(0);
    const int stage = models.zero(0).stage();
    StageModels restored(plans, model_device(m), stage, std::vector<int>(plans.size(), 1),
                         stage_groups(dist), adamw_config(cfg));
    restore_checkpoint(ck, restored.states());
    // The same micro-batch through both models' pipelines (the last one
    // trained on), compared on the stage that holds the loss.
    std::vector<int32_t> ids(size_t(m.acts.ids.numel())), targets(size_t(m.acts.targets.numel()));
    read_to_host(m.acts.ids, ids.data());
    read_to_host(m.acts.targets, targets.data());
    auto forward = [&](StageModels& s) {
      return run_pipeline_forward(s.models(), dist.pp_group(), 1, [&](Model& chunk, int64_t mb) {
               write_from_host(activations_of(chunk, mb).ids, ids.data());
               write_from_host(activations_of(chunk, mb).targets, targets.data());
             }).loss_sum /
             double(m.dims.N());
    };
    losses[0] = forward(models);
    losses[1] = forward(restored);
    ok = same == total && losses[0] == losses[1] &&
         restored.zero(0).optimizer_step() == models.zero(0).optimizer_step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  double failed = ok ? 0 : 1;
  dist.host().all_reduce(Tensor(&failed, DType::F64, {1}));
  // Stages without the head compute no loss: the detail shows the last stage's.
  dist.host().all_reduce(Tensor(losses, DType::F64, {2}), ReduceOp::Max);
  sum.roundtrip_ok = failed == 0;
  if (!error.empty()) {
    sum.roundtrip_detail = error;
    return;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu/%zu tensors identical after save -> load, loss %.6f vs %.6f after restore%s",
                same, total, losses[0], losses[1],
                launch.world_size > 1 ? (" (rank " + std::to_string(launch.rank) + ")").c_str() : "");
  sum.roundtrip_detail = buf;
  if (ok && failed > 0) sum.roundtrip_detail += "; but it failed on " + std::to_string(int64_t(failed)) + " other rank(s)";
}

}  // namespace trainer
