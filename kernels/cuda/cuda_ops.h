// The CUDA backend: same signatures and semantics as kernels/ops.h.
//
// Element types: activations, weights and their gradients may be BF16, F16 or
// F32 (storage); every kernel computes in fp32. Statistics that backward reads
// or that are reduced across tokens stay F32: rstd, mean, lse, losses, probs,
// topk_w, aux, and the AdamW master weights and moments. Index tensors
// (ids, targets, topk_idx, row_map, offsets) are I32. Every op launches on
// cuda::stream() and returns without synchronising, except those returning
// a double (sum, sum_squares), which synchronise to read the result.
#pragma once

#include "kernels/ops.h"

namespace trainer::cuda {

using ops::AdamWStep;

void fill(Tensor t, float value);
void copy(Tensor dst, Tensor src);
void add(Tensor out, Tensor a, Tensor b);
void add_inplace(Tensor acc, Tensor x);
void scale_inplace(Tensor t, float s);
void convert(Tensor dst, Tensor src);
double sum_squares(Tensor x);
double sum(Tensor x);
void embedding_forward(Tensor out, Tensor ids, Tensor table, bool accumulate);
void embedding_backward(Tensor dtable, Tensor ids, Tensor dout);
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps);
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd);
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias, float eps);
void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x, Tensor weight, Tensor mean, Tensor rstd);
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, bool accumulate_dinp);
void rope_forward(Tensor out, Tensor inp, float theta);
void rope_backward(Tensor dinp, Tensor dout, float theta);
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal);
void gelu_forward(Tensor out, Tensor inp);
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp);
void swiglu_forward(Tensor out, Tensor gate, Tensor up);
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);
void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets, float grad_scale);
void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool normalize);
void moe_aux_loss_forward(Tensor aux, Tensor probs, Tensor topk_idx);
void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor topk_w, bool normalize, float aux_grad);
void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts, int capacity);
void moe_permute(Tensor xp, Tensor x, Tensor row_map);
void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map);
void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w);
void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map, Tensor topk_w);
void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets);
void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets);
void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s);
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, const AdamWStep& s);

}  // namespace trainer::cuda
