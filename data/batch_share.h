// Which part of a step's global batch a rank holds. Data parallelism splits
// the sequences, context parallelism every sequence's tokens; the union over
// the ranks is the one-process batch whatever the layout, which is what lets
// every layout reproduce one process.
//
// Sequences: micro-batch m, row b of data-parallel rank r is global sequence
//   m B dp + r B + b    (B sequences per micro-batch)
// so each micro-batch of the step is the same B dp sequences on any dp.
//
// Tokens: a sequence of T splits into 2 cp chunks of T / (2 cp); context
// rank r holds chunk r and chunk 2 cp - 1 - r (zigzag), so that under the
// causal mask every rank has the same attention work (model/context_parallel.h).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace trainer {

// The global sequence indices data-parallel rank `dp_rank` reads for one step
// of `micro_steps` micro-batches of `micro_batch` sequences, in [m][b] order.
std::vector<int64_t> rank_sequences(int64_t micro_steps, int64_t micro_batch, int dp, int dp_rank);

// The two chunks (of 2 cp) of every sequence that rank `rank` holds, in
// local order: chunk rank, then chunk 2 cp - 1 - rank.
std::array<int64_t, 2> zigzag_chunks(int cp, int rank);

// The global positions of rank `rank`'s local tokens of a sequence of T
// (2 cp chunks of T / (2 cp); T must be a multiple of 2 cp): its first
// chunk, then its second.
std::vector<int32_t> zigzag_positions(int64_t T, int cp, int rank);

// The local token rows of a micro-batch of B whole sequences of T tokens:
// out[b T/cp + t] = full[b T + positions[t]].
void zigzag_tokens(const int32_t* full, int64_t B, int64_t T, int cp, int rank, int32_t* out);

}  // namespace trainer
