#include "model/context_parallel.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/ops.h"

namespace trainer {

Tensor ContextParallel::positions_of(int r) const {
  const int64_t Tl = positions.dim(1);
  return positions.slice0(r, r + 1).view({Tl});
}

bool ring_block_needed(int64_t T_global, int cp, int q_rank, int k_rank, int64_t window) {
  const int64_t c = T_global / (2 * int64_t(cp));  // chunk length
  for (const int64_t a : zigzag_chunks(cp, q_rank))
    for (const int64_t b : zigzag_chunks(cp, k_rank)) {
      if (b > a) continue;  // every key after every query
      // The closest pair: the first query of chunk a and the last key of
      // chunk b (the same position when a == b).
      const int64_t gap = a == b ? 0 : (a - b - 1) * c + 1;
      if (window <= 0 || gap <= window) return true;
    }
  return false;
}

void ring_attention_forward(const ContextParallel& cp, Tensor o, Tensor lse, Tensor q, Tensor k, Tensor v,
                            int64_t window, Tensor doc_start) {
  const int P = cp.size(), r = cp.rank();
  const int64_t T_global = cp.positions.dim(1) * P;
  const Tensor q_pos = cp.positions_of(r);
  ops::fill(o, 0.f);
  ops::fill(lse, -INFINITY);
  Tensor kc = k, vc = v;  // the block in hand: rank (r - s) mod P's at step s
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P;
    // Pass the block on, take the previous rank's, while computing on it:
    // the buffer received into is never the one being sent or read.
    std::unique_ptr<Work> pass;
    const Tensor kn = cp.k[s % 2], vn = cp.v[s % 2];
    if (s + 1 < P)
      pass = cp.group->batch_send_recv_async(
          {{true, kc, (r + 1) % P}, {true, vc, (r + 1) % P}, {false, kn, (r + P - 1) % P}, {false, vn, (r + P - 1) % P}});
    if (pass && !cp.overlap) pass->wait();
    // A block every query has left behind (window) adds nothing: not even
    // its merge runs. It still travels on: later ranks may need it.
    if (ring_block_needed(T_global, P, r, src, window)) {
      ops::attention_forward_pos(cp.part_o, cp.part_lse, q, kc, vc, q_pos, cp.positions_of(src), window, doc_start);
      ops::attention_merge(o, lse, cp.part_o, cp.part_lse);
    }
    if (!pass) break;
    if (cp.overlap) pass->wait();
    kc = kn;
    vc = vn;
  }
}

void ring_attention_backward(const ContextParallel& cp, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                             Tensor k, Tensor v, Tensor o, Tensor lse, int64_t window, Tensor doc_start) {
  const int P = cp.size(), r = cp.rank();
  const int64_t T_global = cp.positions.dim(1) * P;
  const Tensor q_pos = cp.positions_of(r);
  ops::fill(dq, 0.f);
  ops::fill(dk, 0.f);
  ops::fill(dv, 0.f);
  // The block in hand with its gradient so far; after P passes every
  // block's gradient is back on its owner, in dk, dv.
  Tensor kc = k, vc = v, dkc = dk, dvc = dv;
  for (int s = 0; s < P; ++s) {
    const int src = (r - s + P) % P;
    const int next = (r + 1) % P, prev = (r + P - 1) % P;
    const bool last = s + 1 == P;
    // The next key/value block travels while this one's gradients are
    // computed; the gradients, made by that computation, follow it.
    std::unique_ptr<Work> pass;
    if (P > 1 && !last)
      pass = cp.group->batch_send_recv_async(
          {{true, kc, next}, {true, vc, next}, {false, cp.k[s % 2], prev}, {false, cp.v[s % 2], prev}});
    if (pass && !cp.overlap) pass->wait();
    if (ring_block_needed(T_global, P, r, src, window))
      ops::attention_backward_pos(dq, dkc, dvc, dout, q, kc, vc, o, lse, q_pos, cp.positions_of(src), window,
                                  doc_start);
    if (P == 1) break;
    const Tensor dkn = last ? dk : cp.dk[s % 2], dvn = last ? dv : cp.dv[s % 2];
    cp.group->batch_send_recv({{true, dkc, next}, {true, dvc, next}, {false, dkn, prev}, {false, dvn, prev}});
    if (pass && cp.overlap) pass->wait();
    if (last) break;
    kc = cp.k[s % 2];
    vc = cp.v[s % 2];
    dkc = dkn;
    dvc = dvn;
  }
}

}  // namespace trainer
