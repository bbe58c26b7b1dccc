// ZeRO data parallelism (docs/ARCHITECTURE.md "ZeRO"): one rank's share of the training
// state and the gradient / parameter communication, driven by the unit hooks
// of model_forward / model_backward.
//
//   stage 0  every rank keeps everything; gradients are all-reduced unit by
//            unit as backward finishes them (on the last micro-batch).
//   stage 1  AdamW m, v (and fp32 masters) exist for this rank's shard only;
//            gradients are reduce-scattered unit by unit on the last
//            micro-batch, each rank updates its shard, and the updated
//            weights are all-gathered.
//   stage 2  as 1, but the full gradient arena is gone: each unit's
//            gradients are written into a pooled unit buffer and
//            reduce-scattered into this rank's gradient shard as soon as
//            backward finishes the unit, on every micro-batch (keeping
//            full gradients across micro-batches is the memory stage 2
//            exists to save).
//   stage 3  as 2, and the weights too are sharded: before a unit is used,
//            forward and backward all-gather it into a pooled buffer, with
//            the next unit prefetched asynchronously; buffers are reused
//            once their unit is no longer needed.
//
// A unit (model/units.h) is the communication bucket. On a GPU the
// collectives run on NCCL's stream after the compute that produced their
// input; on the CPU on the Gloo worker thread while backward goes on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/zero_partition.h"

namespace trainer {

namespace ops {
struct AdamWStep;
}

// How build_model must lay out a model for a stage (full or unbound arenas).
ModelStorage zero_model_storage(int stage);

// Bytes per rank of each memory category at a stage (for the memory plan;
// equal to what ZeroOptimizer and build_model allocate for this plan).
struct ZeroBytes {
  size_t params = 0, grads = 0, optimizer = 0;
  size_t host = 0;  // ZeRO-Offload: m, v, fp32 masters and gradients (and staging) in host memory
};
ZeroBytes zero_bytes(const ShardingPlan& plan, int stage, bool offload = false);
// The sizes of the ZeRO-2/3 unit buffers (gradient pool; at stage 3 the
// weight pool too), largest first: optim/zero_traffic.cpp replays the
// weight pool to count the all-gathers it issues.
std::vector<size_t> zero_pool_slot_bytes(const std::vector<UnitLayout>& units);

// A piece of the training state that every rank of `group` holds the same
// (the replica check, train/replica_check.h).
struct ReplicaPiece {
  const char* what;               // "weights", "optim m", "optim v", "fp32 master"
  int param = 0;                  // index into the model's parameters
  int64_t begin = 0;              // first element of the piece in the parameter
  Tensor t;
  const Communicator* group = nullptr;
  int owner = -1;                 // ZeRO 1-2: the global rank that updated it and gathered it to the others
};

class ZeroOptimizer final : public UnitHooks {
 public:
  // `m` must have been built with zero_model_storage(stage) from a plan
  // whose unit groups are these communicators: `dense` carries the
  // gradients and weights of dense units (dp x cp), `expert` those of expert
  // units (expert data parallel; the same communicator while ep = 1).
  // `host` (host tensors) sums the squared-norm pieces.
  ZeroOptimizer(Model& m, int stage, Communicator& dense, Communicator& expert, Communicator& host,
                const AdamWConfig& cfg);
  // One data-parallel group for every unit.
  ZeroOptimizer(Model& m, int stage, Communicator& dp, Communicator& host, const AdamWConfig& cfg)
      : ZeroOptimizer(m, stage, dp, dp, host, cfg) {}
  ~ZeroOptimizer() override;

  // Pipeline parallelism with a tied embedding: the first and the last
  // stage each hold a copy of the table, whose gradients are summed between
  // the two (over `pp`, the pipeline group) before the data-parallel
  // reduction, once all of this step's backwards ran (finish_backward).
  // Stages 0-1 only: ZeRO-2/3 reduce every micro-batch.
  void set_pipeline(Communicator* pp);
  // false: every reduction and gather is waited for as soon as it is issued
  // and ZeRO-3 prefetches nothing (parallel.overlap): the same arithmetic in
  // the same order, without the overlap.
  // At stages 1-2 with overlap, the gathers of the updated weights that
  // step() leaves in flight are each waited for where their unit is first
  // used; settle() waits for all of them, for anything that reads the whole
  // weights outside a forward or backward (taken by load, step and
  // gather_fp32_weights themselves).
  void settle();
  void set_overlap(bool on) { overlap_ = on; }

  int stage() const { return stage_; }
  int64_t optimizer_step() const { return step_; }
  void set_optimizer_step(int64_t s) { step_ = s; }
  // Device bytes of the optimizer state; with offload it is all in host
  // memory (host_bytes: moments, masters, fp32 gradients, staging).
  size_t optimizer_bytes() const { return offload_ ? 0 : opt_arena_.capacity(); }
  size_t host_bytes() const {
    return offload_ ? opt_arena_.capacity() + host_grads_.capacity() + host_stage_.capacity() : 0;
  }
  // What this optimizer and its model hold for weights and gradients: the
  // full arenas, the shards, and the unit buffers (the gradient pool's
  // buffers counted with the gradients, the weight pool's with the weights),
  // as zero_bytes predicts them.
  size_t param_bytes() const;
  size_t grad_bytes() const;

  // Sets the fp32 value of this rank's elements: `read(param, begin, count,
  // dst)` supplies elements [begin, begin + count) of a parameter (in
  // bounded chunks), for the weights and (when `moments`) for AdamW m and v.
  // Without `moments`, m and v must still be as allocated (zero): only a
  // fresh optimizer is loaded that way. Collective: the updated shards are
  // gathered afterwards.
  using PieceReader = std::function<void(const std::string& what, int param, int64_t begin, int64_t count, float* dst)>;
  void load(const PieceReader& read, bool moments);

  // One optimizer step: begin_step, the micro-batches' forward and backward
  // (the hooks learn from MicroBatch::last which backward completes the
  // gradients), then finish_backward, grad_sum_squares, step.
  void begin_step();
  void finish_backward();          // every reduction of this step has landed
  double grad_sum_squares();       // of the summed gradient, over all ranks
  // The first of this rank's parameters (in parameter order) whose reduced
  // gradient holds a NaN or Inf; "" when none. Not collective.
  std::string first_nonfinite_gradient();
  // What this rank holds that the other ranks of a data-parallel group hold
  // too: at stages 0-2 the weights of every unit replicated over its group
  // (at 1-2 cut at shard boundaries, each piece with its owner), at stage 0
  // also AdamW's m, v and fp32 masters. Stage 3 replicates nothing over dp.
  // settle() first: a weight gather in flight is not yet a replica.
  std::vector<ReplicaPiece> replica_pieces() const;
  // This rank's part of the last grad_sum_squares (before the host sum).
  double local_sum_squares() const { return local_sum_squares_; }
  // Test hook (train/test_hooks.h): the next unit whose gradients are
  // complete gets a NaN in its first element on this rank, before they are
  // reduced, as a NaN produced by this rank's backward would.
  void poison_next_gradient() { poison_ = true; }
  // train.rerun_flagged: the sum of squares of this rank's own gradients
  // before any reduction, over the step (one more pass over them while on):
  // what tells, on a re-run, which rank computed something else.
  void set_gradient_fingerprint(bool on) { fingerprint_on_ = on; }
  double gradient_fingerprint() const { return fingerprint_; }
  void step(double lr, double grad_scale);

  // The elements this rank writes to a checkpoint (its dp shard at every
  // stage) and their fp32 weight, m and v.
  const std::vector<ZeroPiece>& save_pieces() const { return save_pieces_; }
  // The elements this rank updates and loads (stage 0: every element).
  const std::vector<ZeroPiece>& own_pieces() const { return opt_pieces_; }
  Tensor fp32_weight(const ZeroPiece& p) const;
  Tensor moment_m(const ZeroPiece& p) const;
  Tensor moment_v(const ZeroPiece& p) const;
  // The whole model's fp32 weights on every rank, one vector per entry of
  // `global` (the one-process parameter list; collective over the host
  // group, for sampling).
  std::vector<std::vector<float>> gather_fp32_weights(const std::vector<ParamInfo>& global);

  void forward_begin(Model& m, int unit, const MicroBatch& mb) override;
  void backward_begin(Model& m, int unit, const MicroBatch& mb) override;
  void backward_end(Model& m, int unit, const MicroBatch& mb) override;

 private:
  struct Slot {
    int unit = -1;
    Tensor buf, staging;
    std::unique_ptr<Work> pending;
    uint64_t used = 0;
  };
  Tensor flat(void* base, DType t, int64_t offset, int64_t count) const;
  Tensor weight_view(const ZeroPiece& p) const;
  Tensor grad_view(const ZeroPiece& p) const;
  Tensor opt_view(const Arena& a, int which, const ZeroPiece& p, DType t = DType::F32) const;
  void weights_from_host(const ZeroPiece& p);       // ZeRO-Offload
  void offload_step(const ops::AdamWStep& st);
  int64_t opt_index(const ZeroPiece& p) const;
  Tensor unit_range(const Arena& a, int unit) const;   // a unit of a full arena
  Tensor own_shard(const Arena& a, int unit) const;    // this rank's shard of it
  Tensor shard_of(const Arena& a, int unit) const;     // unit's part of a shard arena
  void bind(std::vector<std::vector<Tensor*>>& slots, int unit, void* base);
  void gather_all_units(bool leave_in_flight);
  void settle_unit(int unit);
  void drop_gathered();  // ZeRO-3: after the weights changed, every gathered copy is stale
  // ZeRO-3 weight buffers.
  void make_resident(std::vector<int> need);
  bool weights_resident(int unit, const std::vector<int>& pinned);  // false: no buffer fits
  void prefetch_weights(int unit, const std::vector<int>& pinned);
  Slot* take_slot(std::vector<Slot>& pool, int unit, const std::vector<int>& pinned);  // null: none fits
  void release(Slot& s);
  std::vector<int> units_for(int unit) const;  // units resident together (a layer's experts, a tied embedding)
  // ZeRO-2/3 gradient buffers.
  void open_grads(int unit);
  void close_grads(int unit);
  void land(Slot& s);
  void sum_over_tp(int unit, bool bound);  // partial gradients over tp ranks (sp norms, replicated kv heads)
  bool has_tied(int unit) const;           // holds a copy of a tied table summed over the pipeline ends
  void issue_reduction(int unit);          // stages 0-1: the unit's data-parallel reduction

  Communicator& comm(int unit) const;
  int shards(int unit) const { return units_[size_t(unit)].shards; }
  int64_t shard_elems_of(int unit) const { return shard_elems(units_[size_t(unit)], elem_); }

  Model& m_;
  int stage_;
  Communicator& dense_;
  Communicator& expert_;
  Communicator& host_;
  std::vector<int> urank_;                // this rank's shard of each unit
  AdamWConfig cfg_;
  int64_t step_ = 0;
  bool poison_ = false;
  bool overlap_ = true;
  double local_sum_squares_ = 0;
  void before_reduction(Tensor grads);  // the poison hook and the fingerprint
  bool fingerprint_on_ = false;
  double fingerprint_ = 0;
  bool mixed_ = false;
  size_t elem_ = 4;
  std::vector<UnitLayout> units_;
  std::vector<int64_t> shard_off_;        // per unit, into shard arenas and stage 1-3 optimizer state
  std::vector<ZeroPiece> opt_pieces_, save_pieces_;
  int64_t opt_elems_ = 0;
  Arena opt_arena_;                       // m | v | master, F32 (on the host with offload)
  bool offload_ = false;
  Arena host_grads_, host_stage_;         // ZeRO-Offload: fp32 gradients; weights' dtype staging
  Arena param_shard_, grad_shard_;        // stage 3 / stages 2-3
  Arena pool_arena_;
  Arena kv_scratch_;                      // replicated kv heads: every tp rank's gradient part
  Communicator* pp_ = nullptr;            // pipeline group (tied embedding across stages)
  std::vector<int> tied_units_;           // this step's units waiting for the tied sum
  Arena tie_scratch_;                     // the other pipeline end's gradient of the tied table
  std::vector<Slot> wslots_, gslots_;
  std::vector<std::unique_ptr<Work>> pending_;  // stage 0/1 reductions
  std::vector<std::unique_ptr<Work>> param_gathers_;  // stages 1-2: per unit, the gather step() left in flight
  std::vector<std::vector<Tensor*>> w_slots_, g_slots_;
  uint64_t clock_ = 0;
};

}  // namespace trainer
