#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

void mlp_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a,
                       Tensor x_out) {
  norm_forward(d, own_rows(d, tp, a.h2), a.mean2, a.rstd2, a.x_mid, w.mlp_norm_w, w.mlp_norm_b);
  column_input(d, tp, a.h2);
  const Tensor y = row_partial(d, tp, x_out);
  if (d.llama) {
    ops::linear_forward(a.a1, a.h2, w.w_gate, {});
    ops::linear_forward(a.a2, a.h2, w.w_up, {});
    ops::swiglu_forward(a.act, a.a1, a.a2);
    ops::linear_forward(y, a.act, w.w_down, {});
  } else {
    ops::linear_forward(a.a1, a.h2, w.w_fc, w.b_fc);
    ops::gelu_forward(a.act, a.a1);
    ops::linear_forward(y, a.act, w.w_proj, tp.rank() == 0 ? w.b_proj : Tensor{});
  }
  row_output(d, tp, x_out, y);
  ops::add_inplace(x_out, a.x_mid);
}

void mlp_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g) {
  const Tensor dy = row_output_grad(d, tp, g.dres);
  // Input gradients, then weight gradients (layers.h).
  Tensor dh;
  if (d.llama) {
    ops::linear_backward(g.dact, {}, {}, dy, a.act, w.w_down, false);
    ops::swiglu_backward(g.d1, g.d2, g.dact, a.a1, a.a2);
    ops::linear_backward(g.dh, {}, {}, g.d1, a.h2, w.w_gate, false);
    ops::linear_backward(g.dh, {}, {}, g.d2, a.h2, w.w_up, true);
    dh = column_input_grad(d, tp, g.dh);
    ops::linear_backward({}, gw.w_down, {}, dy, a.act, w.w_down, false);
    ops::linear_backward({}, gw.w_gate, {}, g.d1, a.h2, w.w_gate, false);
    ops::linear_backward({}, gw.w_up, {}, g.d2, a.h2, w.w_up, false);
  } else {
    ops::linear_backward(g.dact, {}, {}, dy, a.act, w.w_proj, false);
    ops::gelu_backward(g.d1, g.dact, a.a1);
    ops::linear_backward(g.dh, {}, {}, g.d1, a.h2, w.w_fc, false);
    dh = column_input_grad(d, tp, g.dh);
    ops::linear_backward({}, gw.w_proj, gw.b_proj, dy, a.act, w.w_proj, false);
    ops::linear_backward({}, gw.w_fc, gw.b_fc, g.d1, a.h2, w.w_fc, false);
  }
  norm_backward(d, g.dres, gw.mlp_norm_w, gw.mlp_norm_b, dh, a.x_mid, w.mlp_norm_w, a.mean2, a.rstd2);
}

}  // namespace trainer
