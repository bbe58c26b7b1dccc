// What the tensor-parallel collectives of a training step move, derived
// from the same regions the blocks run (model/tensor_parallel.h), so the
// start-up plan can print it and a test can hold the real collectives to it.
//
// Payload: the bytes of the whole tensor a collective is about (an
// all-reduce's tensor, an all-gather's output, a reduce-scatter's input).
// Over a ring of p ranks each rank sends
//   all-reduce                      2 (p - 1) / p x payload
//   all-gather, reduce-scatter          (p - 1) / p x payload
// so sequence parallelism's all-gather + reduce-scatter pair moves what one
// all-reduce moves, while the regions between them hold 1/p of the tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/sharding.h"

namespace trainer {

enum class TpOp { AllReduce, AllGather, ReduceScatter };
const char* tp_op_name(TpOp op);  // "all_reduce", "all_gather", "reduce_scatter"

struct TpCollective {
  std::string where;       // "attention forward (row output)"
  TpOp op = TpOp::AllReduce;
  int64_t payload = 0;     // bytes
  int64_t calls = 0;       // per step
};

struct TpTraffic {
  int tp = 1;
  std::vector<TpCollective> collectives;  // the call sites, with their calls per step
  int64_t payload(TpOp op) const;         // bytes per step, summed over the call sites
  int64_t wire_bytes_per_rank() const;    // ring estimate per rank per step
};

// One training step of `micro_batches` micro-batches on this rank's plan
// (nothing when tp = 1). The norm gradient sums of sequence parallelism run
// once per step at ZeRO 0-1 and once per micro-batch at ZeRO 2-3, where the
// gradients are reduced micro-batch by micro-batch.
TpTraffic tp_traffic(const ShardingPlan& plan, int64_t micro_batches);
// All model chunks of a rank (interleaved pipelining): their call sites added up.
TpTraffic tp_traffic(const std::vector<ShardingPlan>& chunks, int64_t micro_batches);

// Lines for the start-up plan: per call site the payload, the calls per step
// and the formula, then the total per rank.
std::string format_tp_traffic(const TpTraffic& t);

}  // namespace trainer
