// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order
// with each backward split into its input-gradient half BI, which the
// previous stage waits for, and its weight-gradient half BW, which nobody
// waits for. Rank r runs 1F1B's p - r - 1 warm-up forwards and then F, BI
// pairs; its weight halves trail its input halves by r micro-batches, so the
// later ranks, which 1F1B leaves idle at the start of the drain, finish
// their input gradients sooner and fill the drain with the deferred weight
// work. With F = BI = BW the bubble falls from 1F1B's (p - 1)(F + B) to
// about (p - 1)(F + BI - BW) per rank, a third; every rank holds at most p
// micro-batches of activations (1F1B's peak, on rank 0), since a slot is
// kept until its weight half ran.
#include <algorithm>

#include "pipeline/schedule.h"

namespace trainer {

std::vector<Action> zb_h1_order(int stages, int rank, int microbatches) {
  const int warmup = std::min(stages - rank - 1, microbatches);
  const int lag = rank;
  std::vector<Action> out;
  int f = 0, bi = 0, bw = 0;
  auto input = [&] { out.push_back({ActionKind::BackwardInput, bi++, 0, -1}); };
  auto weight = [&] { out.push_back({ActionKind::BackwardWeight, bw++, 0, -1}); };
  for (; f < warmup; ++f) out.push_back({ActionKind::Forward, f, 0, -1});
  for (; f < microbatches; ++f) {
    out.push_back({ActionKind::Forward, f, 0, -1});
    input();
    if (bi - bw > lag) weight();
  }
  while (bi < microbatches) {
    input();
    if (bi - bw > lag) weight();
  }
  while (bw < microbatches) weight();
  return out;
}

}  // namespace trainer
