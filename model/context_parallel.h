// Context parallelism (docs/ARCHITECTURE.md "Context parallelism"): the cp
// ranks of a data-parallel replica read the same sequences and each keeps
// two of the 2 cp equal chunks of every sequence, rank r chunks r and
// 2 cp - 1 - r (zigzag), so that under the causal mask every rank has the
// same attention work. Everything but attention is per token and runs on
// the local rows unchanged; positions (RoPE, learned position tables) are
// the tokens' places in the whole sequence. Attention runs as a ring: each
// rank's keys and values travel around the cp group, every rank attends
// with its queries to each block it holds (the mask by global position)
// and merges the partial results with their log-sum-exp; the backward
// sends the blocks around again with their key/value gradients, which end
// on their owner. A group of one is plain attention.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "data/batch_share.h"
#include "model/dims.h"

namespace trainer {

// The zigzag split of a sequence (zigzag_chunks, zigzag_positions,
// zigzag_tokens) is the batch's: data/batch_share.h.

// What attention needs for the ring: the group, every rank's positions
// [cp, T_local] (I32), and its transfer and partial-result buffers.
struct ContextParallel {
  Communicator* group = nullptr;
  Tensor positions;             // row s: rank s's token positions
  Tensor k[2], v[2];            // blocks received in turn [B, T_local, Hkv, D]
  Tensor dk[2], dv[2];          // their travelling gradients
  Tensor part_o, part_lse;      // one block's partial attention [B, T_local, Hq, D], [B, Hq, T_local]
  // A MoE layer's capacity admitted over the whole sequences
  // (model/moe_routing_plan.h): every rank's expert choices [cp N, K] in
  // rank order and in sequence order, that plan's offsets [E + 1], and this
  // rank's admissions [N, K]. Present with cp > 1, MoE and a capacity.
  Tensor moe_all_rows, moe_all_idx, moe_all_offsets, moe_admitted;
  // Post the next block's pass before computing on this one, wait after.
  bool overlap = true;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
  Tensor positions_of(int r) const;
};

// Whether any query of rank q_rank sees any key of rank k_rank, for a
// sequence of T_global tokens in zigzag chunks under a sliding window
// (0: none, every earlier key is seen): the ring skips the attention of the
// blocks no query needs (a window shorter than a chunk leaves only the
// neighbouring chunks).
bool ring_block_needed(int64_t T_global, int cp, int q_rank, int k_rank, int64_t window);

// o [B,T,Hq,D], lse [B,Hq,T]: attention of the local queries over the whole
// sequence's keys (causal by position, within `window` positions back; 0:
// no window); q, k, v are this rank's. doc_start [B*T] I32 (separate
// documents; empty: none): where each local query's document starts, by
// position in the whole sequence; the kernels skip the key tiles of a block
// that hold only earlier documents.
void ring_attention_forward(const ContextParallel& cp, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v,
                            int64_t window, Tensor doc_start);
// dq, dk, dv overwritten with the gradients of this rank's q, k, v.
void ring_attention_backward(const ContextParallel& cp, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                             Tensor k, Tensor v, Tensor o, Tensor lse, int64_t window, Tensor doc_start);

}  // namespace trainer
