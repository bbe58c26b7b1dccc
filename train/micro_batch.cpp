#include "train/micro_batch.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "core/device_memory.h"
#include "data/batch_share.h"
#include "pipeline/executor.h"
#include "train/stage_models.h"

namespace trainer {

namespace {

// Separate documents: where each local token's document starts (by position
// in the whole sequence) and its position inside it, which RoPE (gpt2: the
// learned table) uses instead of the position in the sequence.
void load_documents(const HostBatch& hb, const ModelDims& d, Activations& a, int64_t micro) {
  const int32_t* ds = hb.doc_start_of(micro);
  if (ds == nullptr)
    throw std::logic_error("data.documents: separate, but the step's batch carries no document starts");
  const size_t N = size_t(d.N());
  std::vector<int32_t> local(ds, ds + (d.cp > 1 ? 0 : N)), pos(N);
  std::vector<int32_t> place;
  if (d.cp > 1) {
    local.resize(N);
    zigzag_tokens(ds, hb.micro_batch, hb.seq_len, d.cp, d.cp_rank, local.data());
    place = zigzag_positions(hb.seq_len, d.cp, d.cp_rank);
  }
  for (size_t n = 0; n < N; ++n) {
    const int32_t p = d.cp > 1 ? place[n % size_t(d.T)] : int32_t(n % size_t(d.T));
    pos[n] = p - local[n];
  }
  write_from_host(a.doc_start, local.data());
  write_from_host(d.llama ? a.tok_pos : a.pos_ids, pos.data());
}

}  // namespace

void load_micro_batch(const HostBatch& hb, Model& m, int64_t micro) {
  Activations& a = activations_of(m, micro);
  const ModelDims& d = m.dims;
  if (d.documents) load_documents(hb, d, a, micro);
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

double predicted_share(const HostBatch& hb, Communicator& host, bool counts_batch) {
  if (!hb.masked) return 1.0;
  double c[2] = {0, 0};
  if (counts_batch) {
    for (const int32_t t : hb.targets) c[0] += t >= 0 ? 1 : 0;
    c[1] = double(hb.targets.size());
  }
  host.all_reduce(Tensor(c, DType::F64, {2}));
  // A batch with nothing to predict has a loss sum of 0: any divisor will do.
  return std::max(c[0], 1.0) / c[1];
}

double evaluate(const HostBatch& hb, StageModels& stage, Communicator& pp, Communicator& host, int dp, bool counts,
                int64_t tokens_per_micro, double share) {
  double sum = run_pipeline_forward(stage.models(), pp, hb.micro_steps, [&](Model& m, int64_t mb) {
                 load_micro_batch(hb, m, mb);
               }).loss_sum;
  if (!counts) sum = 0;
  host.all_reduce(Tensor(&sum, DType::F64, {1}));
  return sum / (double(hb.micro_steps * tokens_per_micro * dp) * share);
}

}  // namespace trainer
