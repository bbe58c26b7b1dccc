#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "model/layers.h"

namespace trainer {

void attention_block_forward(const ModelDims& d, const TensorParallel& tp, const ContextParallel& cp,
                             const LayerWeights& w, LayerActs& a, Tensor x_out) {
  const int64_t N = d.N();
  norm_forward(d, a.h1, a.mean1, a.rstd1, a.x_in, w.attn_norm_w, w.attn_norm_b);
  const Tensor h1 = column_input(d, tp, a.h1);
  ops::linear_forward(a.q.view({N, d.Hq * d.D}), h1, w.wq, w.bq);
  ops::linear_forward(a.k.view({N, d.Hkv * d.D}), h1, w.wk, w.bk);
  ops::linear_forward(a.v.view({N, d.Hkv * d.D}), h1, w.wv, w.bv);
  // Under context parallelism the local tokens are two chunks of the
  // sequence: RoPE rotates by their global positions, attention runs as a
  // ring over the cp group (model/context_parallel.h).
  // With separate documents every token has its own position (its place in
  // its document) and attention stops at the document's start.
  if (d.llama) {
    if (d.documents) {
      const Tensor pos = a.tok_pos.view({d.B, d.T});
      ops::rope_forward_pos(a.q, a.q, d.rope, pos);
      ops::rope_forward_pos(a.k, a.k, d.rope, pos);
    } else if (d.cp > 1) {
      const Tensor pos = cp.positions_of(cp.rank());
      ops::rope_forward_pos(a.q, a.q, d.rope, pos);
      ops::rope_forward_pos(a.k, a.k, d.rope, pos);
    } else {
      ops::rope_forward(a.q, a.q, d.rope, 0);
      ops::rope_forward(a.k, a.k, d.rope, 0);
    }
  }
  const Tensor docs = d.documents ? a.doc_start.view({d.B, d.T}) : Tensor{};
  if (d.cp > 1)
    ring_attention_forward(cp, a.o.view({d.B, d.T, d.Hq, d.D}), a.lse, a.q, a.k, a.v, d.window, docs);
  else
    ops::attention_forward(a.o.view({d.B, d.T, d.Hq, d.D}), a.lse, a.q, a.k, a.v, true, d.window, docs);
  const Tensor y = row_partial(d, tp, x_out);
  ops::linear_forward(y, a.o, w.wo, tp.rank() == 0 ? w.bo : Tensor{});
  row_output(d, tp, x_out, y);
  ops::add_inplace(x_out, a.x_in);
}

void attention_block_backward(const ModelDims& d, const TensorParallel& tp, const ContextParallel& cp,
                              const LayerWeights& w, const LayerWeights& gw, const LayerActs& a, GradScratch& g,
                              BackwardPart part) {
  const int64_t N = d.N();
  const bool whole = part == BackwardPart::Whole;
  // The whole sequence's output gradient (g.dres holds this rank's rows
  // under sp). The split keeps a copy: g.dres takes the norm's gradient below.
  Tensor dy = row_output_grad(d, tp, g.dres);
  if (!whole) {
    ops::copy(a.stash.attn_dy, dy);
    dy = a.stash.attn_dy;
  }
  WeightGradInputs in = whole ? WeightGradInputs{} : a.stash;
  if (whole) {
    in.attn_dy = dy;
    in.dq = g.dq;
    in.dk = g.dk;
    in.dv = g.dv;
  }
  // Input gradients: d out -> d o -> d q, k, v -> d h1 (partial over tp heads).
  ops::linear_backward(g.dout, {}, {}, dy, a.o, w.wo, false);
  const Tensor docs = d.documents ? a.doc_start.view({d.B, d.T}) : Tensor{};
  if (d.cp > 1)
    ring_attention_backward(cp, in.dq, in.dk, in.dv, g.dout.view({d.B, d.T, d.Hq, d.D}), a.q, a.k, a.v,
                            a.o.view({d.B, d.T, d.Hq, d.D}), a.lse, d.window, docs);
  else
    ops::attention_backward(in.dq, in.dk, in.dv, g.dout.view({d.B, d.T, d.Hq, d.D}), a.q, a.k, a.v,
                            a.o.view({d.B, d.T, d.Hq, d.D}), a.lse, true, d.window, docs);
  if (d.llama) {
    if (d.documents) {
      const Tensor pos = a.tok_pos.view({d.B, d.T});
      ops::rope_backward_pos(in.dq, in.dq, d.rope, pos);
      ops::rope_backward_pos(in.dk, in.dk, d.rope, pos);
    } else if (d.cp > 1) {
      const Tensor pos = cp.positions_of(cp.rank());
      ops::rope_backward_pos(in.dq, in.dq, d.rope, pos);
      ops::rope_backward_pos(in.dk, in.dk, d.rope, pos);
    } else {
      ops::rope_backward(in.dq, in.dq, d.rope, 0);
      ops::rope_backward(in.dk, in.dk, d.rope, 0);
    }
  }
  // The input gradients read h1 for its shape only.
  const Tensor h1 = column_input_shape(d, tp, a.h1);
  ops::linear_backward(g.dh, {}, {}, in.dq.view({N, d.Hq * d.D}), h1, w.wq, false);
  ops::linear_backward(g.dh, {}, {}, in.dk.view({N, d.Hkv * d.D}), h1, w.wk, true);
  ops::linear_backward(g.dh, {}, {}, in.dv.view({N, d.Hkv * d.D}), h1, w.wv, true);
  const Tensor dh = column_input_grad(d, tp, g.dh);
  // Weight gradients from the same gradients, before the norm overwrites
  // dy (which is g.dres itself without sp).
  if (whole) attention_block_backward_weight(d, tp, w, gw, a, in);
  norm_backward(d, g.dres, gw.attn_norm_w, gw.attn_norm_b, dh, a.x_in, w.attn_norm_w, a.mean1, a.rstd1);
}

void attention_block_backward_weight(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w,
                                     const LayerWeights& gw, const LayerActs& a, const WeightGradInputs& in) {
  const int64_t N = d.N();
  ops::linear_backward({}, gw.wo, gw.bo, in.attn_dy, a.o, w.wo, false);
  const Tensor h1 = column_input(d, tp, a.h1);  // gathered again (sp)
  ops::linear_backward({}, gw.wq, gw.bq, in.dq.view({N, d.Hq * d.D}), h1, w.wq, false);
  ops::linear_backward({}, gw.wk, gw.bk, in.dk.view({N, d.Hkv * d.D}), h1, w.wk, false);
  ops::linear_backward({}, gw.wv, gw.bv, in.dv.view({N, d.Hkv * d.D}), h1, w.wv, false);
}

}  // namespace trainer
