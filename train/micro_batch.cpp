#include "train/micro_batch.h"

#include <vector>

#include "core/device_memory.h"
#include "data/batch_share.h"
#include "pipeline/executor.h"
#include "train/stage_models.h"

namespace trainer {

void load_micro_batch(const HostBatch& hb, Model& m, int64_t micro) {
  Activations& a = activations_of(m, micro);
  const ModelDims& d = m.dims;
  if (d.cp == 1) {
    write_from_host(a.ids, hb.inputs_of(micro));
    write_from_host(a.targets, hb.targets_of(micro));
    return;
  }
  std::vector<int32_t> local(size_t(d.N()));
  zigzag_tokens(hb.inputs_of(micro), hb.micro_batch, hb.seq_len, d.cp, d.cp_rank, local.data());
  write_from_host(a.ids, local.data());
  zigzag_tokens(hb.targets_of(micro), hb.micro_batch, hb.seq_len, d.cp, d.cp_rank, local.data());
  write_from_host(a.targets, local.data());
}

double evaluate(const HostBatch& hb, StageModels& stage, Communicator& pp, Communicator& host, int dp, bool counts,
                int64_t tokens_per_micro) {
  double sum = run_pipeline_forward(stage.models(), pp, hb.micro_steps, [&](Model& m, int64_t mb) {
                 load_micro_batch(hb, m, mb);
               }).loss_sum;
  if (!counts) sum = 0;
  host.all_reduce(Tensor(&sum, DType::F64, {1}));
  return sum / double(hb.micro_steps * tokens_per_micro * dp);
}

}  // namespace trainer
