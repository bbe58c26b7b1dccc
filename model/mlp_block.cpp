#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

void mlp_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a,
                       Tensor x_out) {
  norm_forward(d, a.h2, a.mean2, a.rstd2, a.x_mid, w.mlp_norm_w, w.mlp_norm_b);
  const Tensor h2 = column_input(d, tp, a.h2);
  const Tensor y = row_partial(d, tp, x_out);
  if (d.llama) {
    ops::linear_forward(a.a1, h2, w.w_gate, {});
    ops::linear_forward(a.a2, h2, w.w_up, {});
    ops::swiglu_forward(a.act, a.a1, a.a2);
    ops::linear_forward(y, a.act, w.w_down, {});
  } else {
    ops::linear_forward(a.a1, h2, w.w_fc, w.b_fc);
    ops::gelu_forward(a.act, a.a1);
    ops::linear_forward(y, a.act, w.w_proj, tp.rank() == 0 ? w.b_proj : Tensor{});
  }
  row_output(d, tp, x_out, y);
  ops::add_inplace(x_out, a.x_mid);
}

void mlp_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, BackwardPart part) {
  const bool whole = part == BackwardPart::Whole;
  Tensor dy = row_output_grad(d, tp, g.dres);
  if (!whole) {
    ops::copy(a.stash.mlp_dy, dy);
    dy = a.stash.mlp_dy;
  }
  WeightGradInputs in = whole ? WeightGradInputs{} : a.stash;
  if (whole) {
    in.mlp_dy = dy;
    in.d1 = g.d1;
    in.d2 = g.d2;
  }
  // Input gradients (layers.h); they read h2 for its shape only.
  const Tensor h2 = column_input_shape(d, tp, a.h2);
  if (d.llama) {
    ops::linear_backward(g.dact, {}, {}, dy, a.act, w.w_down, false);
    ops::swiglu_backward(in.d1, in.d2, g.dact, a.a1, a.a2);
    ops::linear_backward(g.dh, {}, {}, in.d1, h2, w.w_gate, false);
    ops::linear_backward(g.dh, {}, {}, in.d2, h2, w.w_up, true);
  } else {
    ops::linear_backward(g.dact, {}, {}, dy, a.act, w.w_proj, false);
    ops::gelu_backward(in.d1, g.dact, a.a1);
    ops::linear_backward(g.dh, {}, {}, in.d1, h2, w.w_fc, false);
  }
  const Tensor dh = column_input_grad(d, tp, g.dh);
  if (whole) mlp_block_backward_weight(d, tp, w, gw, a, in);
  norm_backward(d, g.dres, gw.mlp_norm_w, gw.mlp_norm_b, dh, a.x_mid, w.mlp_norm_w, a.mean2, a.rstd2);
}

void mlp_block_backward_weight(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w,
                               const LayerWeights& gw, const LayerActs& a, const WeightGradInputs& in) {
  const Tensor h2 = column_input(d, tp, a.h2);  // gathered again (sp)
  if (d.llama) {
    ops::linear_backward({}, gw.w_down, {}, in.mlp_dy, a.act, w.w_down, false);
    ops::linear_backward({}, gw.w_gate, {}, in.d1, h2, w.w_gate, false);
    ops::linear_backward({}, gw.w_up, {}, in.d2, h2, w.w_up, false);
  } else {
    ops::linear_backward({}, gw.w_proj, gw.b_proj, in.mlp_dy, a.act, w.w_proj, false);
    ops::linear_backward({}, gw.w_fc, gw.b_fc, in.d1, h2, w.w_fc, false);
  }
}

}  // namespace trainer
