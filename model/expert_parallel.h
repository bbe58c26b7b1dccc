// Expert parallelism inside a MoE layer (docs/ARCHITECTURE.md "Expert
// parallelism"): the ep ranks of a group hold E / ep experts each (rank q
// experts [q E_l, (q+1) E_l)) and see different tokens. Each rank routes and
// dispatches its own tokens exactly as without expert parallelism (so the
// capacity, when there is one, applies per source rank and expert: the same
// rows are kept as in the ep = 1 run of the same data-parallel layout), then
// one all-to-all-v sends each expert's rows to the rank holding it and a
// second brings the outputs back into the dispatch order; the backward runs
// the same two exchanges in reverse. The rows a rank's experts receive are
// grouped by source rank, and within a source by expert.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "model/activations.h"
#include "model/dims.h"

namespace trainer {

// The rows one source rank sent to this rank's experts (its grouped-linear
// segment): [begin, begin + rows) of the experts' buffers, offsets [E_l + 1]
// relative to begin. Without expert parallelism one segment: all N K
// dispatched rows with the layer's own offsets.
struct ExpertSegment {
  int64_t begin = 0, rows = 0;
  Tensor offsets;
};

// Gathers every ep rank's dispatch offsets (one all-gather of E + 1 ints),
// and from them this rank's rows to and from each peer (a.ep_send,
// a.ep_recv) and the received segments' offsets (a.ep_offsets). Throws
// std::runtime_error naming the group when the counts do not fit the
// reserved rows (they always do for counts this code produced).
void ep_plan(const ModelDims& d, Communicator& ep, LayerActs& a);

std::vector<ExpertSegment> expert_segments(const ModelDims& d, const LayerActs& a);
// Rows received by this rank's experts (a.xp's rows without expert parallelism).
int64_t expert_rows_used(const ModelDims& d, const LayerActs& a);

// Rows of `in` go to the peers (in_rows[q] to rank q, in order), theirs land
// in `out` (out_rows[s] from rank s, in order): one all-to-all-v.
void ep_exchange(Communicator& ep, Tensor out, const std::vector<int64_t>& out_rows, Tensor in,
                 const std::vector<int64_t>& in_rows);

}  // namespace trainer
