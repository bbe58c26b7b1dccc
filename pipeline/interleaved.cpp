// Interleaved 1F1B (Megatron-LM's virtual pipeline): each rank holds v model
// chunks, virtual stages r, r + p, ..., so a micro-batch crosses every rank v
// times and the pipeline fills v times faster: the bubble falls to
// (p - 1) / (v m + p - 1) of the step with equal stages. Micro-batches go
// through a chunk in groups of p, so m must be a multiple of p. Rank r warms
// up with 2 (p - r - 1) + (v - 1) p forwards, then alternates one forward
// and one backward; backwards visit the chunks in reverse.
#include <algorithm>
#include <stdexcept>

#include "pipeline/schedule.h"

namespace trainer {

namespace {

// The k-th forward (or backward) unit of a rank: micro-batch and chunk.
Action unit(int stages, int chunks, int k, bool backward) {
  const int group = k / (stages * chunks), within = k % (stages * chunks);
  const int chunk = within / stages;
  Action a;
  a.kind = backward ? ActionKind::Backward : ActionKind::Forward;
  a.mb = group * stages + within % stages;
  a.chunk = backward ? chunks - 1 - chunk : chunk;
  return a;
}

}  // namespace

std::vector<Action> interleaved_order(int stages, int rank, int chunks, int microbatches) {
  if (microbatches % stages != 0)
    throw std::invalid_argument("interleaved 1F1B needs the micro-batches per step (" + std::to_string(microbatches) +
                                ") to be a multiple of the pipeline stages (" + std::to_string(stages) + ")");
  const int total = microbatches * chunks;
  const int warmup = std::min(total, 2 * (stages - rank - 1) + (chunks - 1) * stages);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) out.push_back(unit(stages, chunks, k, false));
  // Steady state: each forward runs with the backward after it, their
  // transfers batched around the pair (schedule.h: Action::paired).
  for (int i = 0; i < total - warmup; ++i) {
    Action f = unit(stages, chunks, warmup + i, false);
    f.paired = true;
    out.push_back(f);
    out.push_back(unit(stages, chunks, i, true));
  }
  for (int i = total - warmup; i < total; ++i) out.push_back(unit(stages, chunks, i, true));
  return out;
}

}  // namespace trainer
