#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

// Experts see only their own rows of the permuted buffer; grouped linears keep
// every expert's matmul in one op so a GPU backend can run them as one
// grouped GEMM without reading the offsets back to the host.
void moe_block_forward(const ModelDims& d, Communicator& tp, const LayerWeights& w, LayerActs& a, Tensor moe_out,
                       Tensor x_out) {
  norm_forward(d, a.h2, a.mean2, a.rstd2, a.x_mid, w.mlp_norm_w, w.mlp_norm_b);
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
  ops::moe_unpermute(moe_out, a.yp, a.row_map, a.topk_w);
  sum_over_tp(tp, moe_out);  // experts' FFN columns split over tp
  ops::add(x_out, a.x_mid, moe_out);
}

void moe_block_backward(const ModelDims& d, Communicator& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, float aux_grad) {
  // Input gradients (layers.h): combine -> experts -> dispatch -> d h2.
  ops::moe_unpermute_backward(g.dyp, g.dtopk_w, g.dres, a.yp, a.row_map, a.topk_w);
  if (d.llama) {
    ops::grouped_linear_backward(g.deact, {}, g.dyp, a.eact, w.e_down, a.offsets);
    ops::swiglu_backward(g.de1, g.de2, g.deact, a.e1, a.e2);
    ops::grouped_linear_backward(g.dxp, {}, g.de1, a.xp, w.e_gate, a.offsets);
    ops::grouped_linear_backward(g.dxp2, {}, g.de2, a.xp, w.e_up, a.offsets);
    ops::add_inplace(g.dxp, g.dxp2);
  } else {
    ops::grouped_linear_backward(g.deact, {}, g.dyp, a.eact, w.e_proj, a.offsets);
    ops::gelu_backward(g.de1, g.deact, a.e1);
    ops::grouped_linear_backward(g.dxp, {}, g.de1, a.xp, w.e_fc, a.offsets);
  }
  ops::fill(g.dh, 0.f);
  ops::moe_permute_backward(g.dh, g.dxp, a.row_map);
  sum_over_tp(tp, g.dh);  // before the router's part, which every tp rank computes whole
  ops::moe_route_backward(g.drlogits, g.dtopk_w, a.probs, a.topk_idx, a.topk_w, d.normalize_topk,
                          aux_grad);
  ops::linear_backward(g.dh, {}, {}, g.drlogits, a.h2, w.router, true);
  // Weight gradients.
  if (d.llama) {
    ops::grouped_linear_backward({}, gw.e_down, g.dyp, a.eact, w.e_down, a.offsets);
    ops::grouped_linear_backward({}, gw.e_gate, g.de1, a.xp, w.e_gate, a.offsets);
    ops::grouped_linear_backward({}, gw.e_up, g.de2, a.xp, w.e_up, a.offsets);
  } else {
    ops::grouped_linear_backward({}, gw.e_proj, g.dyp, a.eact, w.e_proj, a.offsets);
    ops::grouped_linear_backward({}, gw.e_fc, g.de1, a.xp, w.e_fc, a.offsets);
  }
  ops::linear_backward({}, gw.router, {}, g.drlogits, a.h2, w.router, false);
  norm_backward(d, g.dres, gw.mlp_norm_w, gw.mlp_norm_b, g.dh, a.x_mid, w.mlp_norm_w, a.mean2,
                a.rstd2);
}

}  // namespace trainer
