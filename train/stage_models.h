// The model chunks one pipeline rank holds, each with its ZeRO optimizer:
// one chunk, or v under interleaved pipelining (virtual stages r, r + p, ...).
// The engine steps them together: they share the step counter, the gradient
// norm sums over all of them, and a checkpoint holds all of their pieces.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "interop/hf_format.h"

#include "comm/communicator.h"
#include "model/sharding.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/zero.h"
#include "runtime/distributed_run.h"
#include "train/checkpointing.h"

namespace trainer {

struct StageGroups {
  Communicator* tp = nullptr;    // tensor parallel (to the models)
  Communicator* dp = nullptr;    // data parallel (ZeRO: dense units)
  Communicator* host = nullptr;  // every rank, host tensors
  Communicator* pp = nullptr;    // pipeline (tied embedding across the ends)
  Communicator* ep = nullptr;    // expert parallel (to the models)
  Communicator* edp = nullptr;   // expert data parallel (ZeRO: expert units)
  Communicator* cp = nullptr;    // context parallel (to the models: the attention ring)
};
// The groups of this rank.
StageGroups stage_groups(DistributedRun& dist);

class StageModels {
 public:
  // One chunk per plan, chunk c with slots[c] activation slots.
  StageModels(const std::vector<ShardingPlan>& plans, Device device, int zero_stage, const std::vector<int>& slots,
              const StageGroups& groups, const AdamWConfig& cfg);

  size_t size() const { return chunks_.size(); }
  Model& model(size_t c) { return chunks_[c]->model; }
  ZeroOptimizer& zero(size_t c) { return *chunks_[c]->zero; }
  std::vector<Model*> models();
  std::vector<ChunkState> states();

  // Initial weights (a pure function of the seed and the global index).
  void initialise(uint64_t seed);
  // Initial weights from whole tensors (model.init_from: interop/hf_import.h),
  // by parameter name; each rank copies its own pieces.
  void initialise_from(const TensorMap& weights);
  void begin_step();
  void finish_backward();
  double grad_sum_squares();  // collective over the host group, once per chunk
  double local_grad_sum_squares() const;  // this rank's part of the last one
  // ZeroOptimizer's gradient fingerprint, summed over the chunks.
  void set_gradient_fingerprint(bool on);
  double gradient_fingerprint() const;
  // The first parameter of the whole model (in `global` order) whose
  // gradient is non-finite on some rank; "" when none (collective).
  std::string first_nonfinite_gradient(const std::vector<ParamInfo>& global, Communicator& host);
  void step(double lr, double grad_scale);
  size_t optimizer_bytes() const;
  size_t host_bytes() const;  // ZeRO-Offload's host memory
  size_t param_bytes() const;  // weights: arenas, shards and unit buffers (ZeroOptimizer::param_bytes)
  size_t grad_bytes() const;
  // The whole model's fp32 weights on every rank (collective; for sampling).
  std::vector<std::vector<float>> gather_fp32_weights(const std::vector<ParamInfo>& global);

 private:
  struct Chunk {
    Model model;
    std::unique_ptr<ZeroOptimizer> zero;
  };
  std::vector<std::unique_ptr<Chunk>> chunks_;
};

}  // namespace trainer
