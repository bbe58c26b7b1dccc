#include "model/moe_routing_plan.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace trainer {
namespace {

// A chunk of a sequence that a rank holds: its local offset and its global
// position (zigzag_chunks).
struct Run {
  int64_t local, begin, len;
};

std::vector<Run> runs_of(int64_t T_global, int cp, int rank) {
  const int64_t c = T_global / (2 * int64_t(cp));
  std::vector<Run> runs;
  for (const int64_t chunk : zigzag_chunks(cp, rank)) runs.push_back({int64_t(runs.size()) * c, chunk * c, c});
  return runs;
}

// admitted [N, K] (this rank's rows): the row of each assignment in the
// whole micro-batch's plan, -1 where that plan drops it.
void admit_whole_sequences(const ModelDims& d, const ContextParallel& cp, Tensor topk_idx) {
  const int P = cp.size();
  const int64_t N = d.N(), Tl = d.T, Tg = d.T * P;
  if (cp.moe_all_idx.empty() || cp.moe_admitted.empty())
    throw std::logic_error("moe_route_plan: no admission buffers for capacity under cp=" + std::to_string(P));
  // Every rank's choices, rank after rank, then in sequence order; the
  // gathered copy is free once reordered and takes the whole plan's rows.
  const Tensor gathered = cp.moe_all_rows, ordered = cp.moe_all_idx;
  cp.group->all_gather(gathered, topk_idx);
  for (int s = 0; s < P; ++s)
    for (const Run& r : runs_of(Tg, P, s))
      for (int64_t b = 0; b < d.B; ++b) {
        const int64_t from = s * N + b * Tl + r.local, to = b * Tg + r.begin;
        ops::copy(ordered.slice0(to, to + r.len), gathered.slice0(from, from + r.len));
      }
  ops::moe_dispatch_plan(gathered, cp.moe_all_offsets, ordered, int(d.E), int(d.capacity), {});
  for (const Run& r : runs_of(Tg, P, cp.rank()))
    for (int64_t b = 0; b < d.B; ++b) {
      const int64_t mine = b * Tl + r.local, whole = b * Tg + r.begin;
      ops::copy(cp.moe_admitted.slice0(mine, mine + r.len), gathered.slice0(whole, whole + r.len));
    }
}

}  // namespace

void moe_route_plan(const ModelDims& d, const ContextParallel& cp, LayerActs& a) {
  ops::moe_router_stats(a.router_stats, a.probs, a.topk_idx);
  if (cp.size() > 1) cp.group->all_reduce(a.router_stats);
  ops::moe_aux_loss_forward(a.aux, a.router_stats, int(routed_tokens(d)), int(d.K));
  if (cp.size() > 1 && d.capacity > 0) {
    admit_whole_sequences(d, cp, a.topk_idx);
    // Admitted already under the whole micro-batch's capacity.
    ops::moe_dispatch_plan(a.row_map, a.offsets, a.topk_idx, int(d.E), 0, cp.moe_admitted);
  } else {
    ops::moe_dispatch_plan(a.row_map, a.offsets, a.topk_idx, int(d.E), int(d.capacity), {});
  }
}

}  // namespace trainer
