#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

// Experts see only their own rows of the permuted buffer; grouped linears keep
// every expert's matmul in one op so a GPU backend can run them as one
// grouped GEMM without reading the offsets back to the host.
//
// Under tensor parallelism every tp rank routes the whole sequence with the
// same (replicated) router, so all ranks agree on the dispatch; each expert's
// FFN is split over tp like the dense FFN (column-parallel in, row-parallel
// out), which makes the combined output a row output.
void moe_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a,
                       Tensor moe_out, Tensor x_out) {
  norm_forward(d, own_rows(d, tp, a.h2), a.mean2, a.rstd2, a.x_mid, w.mlp_norm_w, w.mlp_norm_b);
  column_input(d, tp, a.h2);
  ops::linear_forward(a.rlogits, a.h2, w.router, {});
  ops::moe_route_forward(a.probs, a.topk_idx, a.topk_w, a.rlogits, d.normalize_topk);
  ops::moe_aux_loss_forward(a.aux, a.probs, a.topk_idx);
  ops::moe_dispatch_plan(a.row_map, a.offsets, a.topk_idx, int(d.E), int(d.capacity));
  ops::moe_permute(a.xp, a.h2, a.row_map);
  if (d.llama) {
    ops::grouped_linear_forward(a.e1, a.xp, w.e_gate, a.offsets);
    ops::grouped_linear_forward(a.e2, a.xp, w.e_up, a.offsets);
    ops::swiglu_forward(a.eact, a.e1, a.e2);
    ops::grouped_linear_forward(a.yp, a.eact, w.e_down, a.offsets);
  } else {
    ops::grouped_linear_forward(a.e1, a.xp, w.e_fc, a.offsets);
    ops::gelu_forward(a.eact, a.e1);
    ops::grouped_linear_forward(a.yp, a.eact, w.e_proj, a.offsets);
  }
  // moe_out: the whole sequence's partial combine; summed into this rank's rows.
  ops::moe_unpermute(moe_out, a.yp, a.row_map, a.topk_w);
  const Tensor mine = own_rows(d, tp, moe_out);
  row_output(d, tp, mine, moe_out);
  ops::add(x_out, a.x_mid, mine);
}

void moe_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, float aux_grad, BackwardPart part) {
  const bool whole = part == BackwardPart::Whole;
  const Tensor dy = row_output_grad(d, tp, g.dres);
  WeightGradInputs in = whole ? WeightGradInputs{} : a.stash;
  if (whole) {
    in.dyp = g.dyp;
    in.de1 = g.de1;
    in.de2 = g.de2;
    in.drlogits = g.drlogits;
  }
  // Input gradients (layers.h): combine -> experts -> dispatch -> d h2.
  ops::moe_unpermute_backward(in.dyp, g.dtopk_w, dy, a.yp, a.row_map, a.topk_w);
  // Each rank's yp holds its part of the experts' columns: the combine
  // weights' gradient dot(dy, yp) is a partial sum too.
  sum_over_tp(tp, g.dtopk_w);
  if (d.llama) {
    ops::grouped_linear_backward(g.deact, {}, in.dyp, a.eact, w.e_down, a.offsets);
    ops::swiglu_backward(in.de1, in.de2, g.deact, a.e1, a.e2);
    ops::grouped_linear_backward(g.dxp, {}, in.de1, a.xp, w.e_gate, a.offsets);
    ops::grouped_linear_backward(g.dxp2, {}, in.de2, a.xp, w.e_up, a.offsets);
    ops::add_inplace(g.dxp, g.dxp2);
  } else {
    ops::grouped_linear_backward(g.deact, {}, in.dyp, a.eact, w.e_proj, a.offsets);
    ops::gelu_backward(in.de1, g.deact, a.e1);
    ops::grouped_linear_backward(g.dxp, {}, in.de1, a.xp, w.e_fc, a.offsets);
  }
  ops::fill(g.dh, 0.f);
  ops::moe_permute_backward(g.dh, g.dxp, a.row_map);
  // Summed over tp before the router's part, which every tp rank computes
  // whole (for its own rows under sp).
  const Tensor dh = column_input_grad(d, tp, g.dh);
  ops::moe_route_backward(in.drlogits, g.dtopk_w, a.probs, a.topk_idx, a.topk_w, d.normalize_topk, aux_grad);
  ops::linear_backward(dh, {}, {}, own_rows(d, tp, in.drlogits), own_rows(d, tp, a.h2), w.router, true);
  if (whole) moe_block_backward_weight(d, w, gw, a, in);
  norm_backward(d, g.dres, gw.mlp_norm_w, gw.mlp_norm_b, dh, a.x_mid, w.mlp_norm_w, a.mean2, a.rstd2);
}

void moe_block_backward_weight(const ModelDims& d, const LayerWeights& w, const LayerWeights& gw, const LayerActs& a,
                               const WeightGradInputs& in) {
  if (d.llama) {
    ops::grouped_linear_backward({}, gw.e_down, in.dyp, a.eact, w.e_down, a.offsets);
    ops::grouped_linear_backward({}, gw.e_gate, in.de1, a.xp, w.e_gate, a.offsets);
    ops::grouped_linear_backward({}, gw.e_up, in.de2, a.xp, w.e_up, a.offsets);
  } else {
    ops::grouped_linear_backward({}, gw.e_proj, in.dyp, a.eact, w.e_proj, a.offsets);
    ops::grouped_linear_backward({}, gw.e_fc, in.de1, a.xp, w.e_fc, a.offsets);
  }
  ops::linear_backward({}, gw.router, {}, in.drlogits, a.h2, w.router, false);
}

}  // namespace trainer
