// The op set: backend-neutral signatures on Tensor views. Model code calls only
// these; ops.cpp routes each call to kernels/cpu (the fp32 reference) or, when
// the tensors live on a GPU, to kernels/cuda. The math of every op is written
// out in docs/MODEL_MATH.md, which the PyTorch reference also follows.
//
// Conventions
//   N = tokens in a micro-batch (B*T), C = channels, V = vocabulary.
//   Parameter gradients accumulate (+=) across micro-batches.
//   Activation gradients overwrite, except where marked (+=): the inputs of
//   norms are the residual stream, whose gradient is a sum.
//   An "empty" Tensor (data == nullptr) means "absent" where allowed.
#pragma once

#include "core/tensor.h"

namespace trainer::ops {

// ---- elementwise and memory -------------------------------------------------
void fill(Tensor t, float value);
void copy(Tensor dst, Tensor src);               // same numel
void add(Tensor out, Tensor a, Tensor b);        // out may alias a or b
void add_inplace(Tensor acc, Tensor x);          // acc += x
void scale_inplace(Tensor t, float s);
// dst = src converted to dst's dtype (F32/BF16/F16); same numel. Also moves
// bytes between host and device when the devices differ (same dtype then).
void convert(Tensor dst, Tensor src);
double sum_squares(Tensor x);                    // sum of x^2 in double (NaN propagates)
double sum(Tensor x);                            // sum in double (losses, aux terms)

// ---- embedding --------------------------------------------------------------
// out[n,:] (= or +=) table[ids[n],:]. ids [N] I32, table [V,C], out [N,C].
void embedding_forward(Tensor out, Tensor ids, Tensor table, bool accumulate);
// dtable[ids[n],:] += dout[n,:]
void embedding_backward(Tensor dtable, Tensor ids, Tensor dout);

// ---- normalization ----------------------------------------------------------
// out = x * rstd * weight, rstd[n] = 1/sqrt(mean(x[n]^2) + eps). x,out [N,C].
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps);
// dx (+=), dweight (+=)
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd);
// out = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + eps) (biased var).
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias,
                       float eps);
// dx (+=), dweight (+=), dbias (+=)
void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                        Tensor weight, Tensor mean, Tensor rstd);

// ---- linear -----------------------------------------------------------------
// out[N,OC] = inp[N,IC] @ weight[OC,IC]^T + bias[OC] (bias may be empty).
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias);
// dinp = dout @ weight (overwrite, or += if accumulate_dinp; may be empty = skip)
// dweight += dout^T @ inp (may be empty = skip);  dbias += column sums of dout (may be empty).
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                     Tensor weight, bool accumulate_dinp);

// ---- rotary position embedding ---------------------------------------------
// x [B,T,H,D], half-split pairs (x[i], x[i+D/2]) for i < D/2 rotated by
// angle = t * theta^(-2i/D), t = position in the sequence. out may alias inp.
void rope_forward(Tensor out, Tensor inp, float theta);
// inverse rotation of dout; dinp may alias dout.
void rope_backward(Tensor dinp, Tensor dout, float theta);

// ---- attention --------------------------------------------------------------
// q [B,T,Hq,D], k,v [B,T,Hkv,D], Hq % Hkv == 0; query head h reads kv head
// h / (Hq/Hkv). scale = 1/sqrt(D). out [B,T,Hq,D].
// lse [B,Hq,T]: log-sum-exp of the scaled (masked) scores, saved for backward.
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal);
// dq, dk, dv overwrite; probabilities are recomputed from lse.
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                        Tensor v, Tensor out, Tensor lse, bool causal);

// ---- activations ------------------------------------------------------------
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(Tensor out, Tensor inp);
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp);       // dinp may alias dout
// out = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
void swiglu_forward(Tensor out, Tensor gate, Tensor up);
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up);

// ---- loss -------------------------------------------------------------------
// logits [N,V], targets [N] I32 (target < 0: ignored, loss 0, gradient 0).
// losses[n] = logsumexp(logits[n]) - logits[n, target[n]].
// If dlogits is non-empty: dlogits = (softmax(logits) - onehot(target)) * grad_scale.
// dlogits may alias logits: no probability tensor is ever stored.
void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                    float grad_scale);

// ---- mixture of experts -----------------------------------------------------
// Router: probs = softmax(logits) [N,E]; topk_idx [N,K] I32 = the K largest
// probabilities per token in descending order (ties: lower expert index
// first); topk_w [N,K] = those probabilities, divided by their sum when
// normalize is true.
void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool normalize);
// Load-balancing loss (Switch/GShard form, written to aux[0]):
//   aux = E * sum_e f_e * P_e,  f_e = (#assignments in topk_idx to e) / (N*K),
//   P_e = mean_n probs[n,e].  f_e is a constant for the gradient.
void moe_aux_loss_forward(Tensor aux, Tensor probs, Tensor topk_idx);
// dlogits [N,E] overwrite, from dtopk_w [N,K] (the gradient of the combine
// weights) and aux_grad (= d loss / d aux, e.g. coefficient * grad scale).
void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx,
                        Tensor topk_w, bool normalize, float aux_grad);
// Dispatch plan with capacity. Assignments are admitted k-major (every token's
// first choice before any second choice), tokens in order within a k, while
// the expert has fewer than `capacity` rows (capacity <= 0: dropless).
// row_map [N,K] I32: row of the assignment in the permuted buffer, -1 if dropped.
// offsets [E+1] I32: rows of expert e are [offsets[e], offsets[e+1]); offsets[E] = kept total.
void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts,
                       int capacity);
// xp[row_map[n,k],:] = x[n,:]; rows >= offsets[E] are zeroed. xp [N*K,C].
void moe_permute(Tensor xp, Tensor x, Tensor row_map);
// dx[n,:] (+=) sum_k dxp[row_map[n,k],:] over kept assignments.
void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map);
// y[n,:] = sum over kept k of topk_w[n,k] * yp[row_map[n,k],:] (overwrite).
void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w);
// dyp[row,:] = topk_w[n,k] * dy[n,:] for kept rows, 0 elsewhere;
// dtopk_w[n,k] = dot(dy[n,:], yp[row,:]) for kept, 0 for dropped.
void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map,
                            Tensor topk_w);
// Per-expert linear over row groups: for rows r in [offsets[e], offsets[e+1]),
// out[r,:] = inp[r,:] @ weight[e]^T. weight [E,OC,IC]; rows >= offsets[E] zeroed.
void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets);
// dinp overwrite (rows >= offsets[E] zeroed), dweight (+=).
void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                             Tensor offsets);

// ---- optimizer --------------------------------------------------------------
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;        // 1-based, for bias correction
  float grad_scale;    // gradient is multiplied by this first (clipping, unscaling)
};
// PyTorch AdamW order: p *= 1 - lr*wd; m,v updated; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s);
// Mixed precision: the update runs on the fp32 master copy (same order as
// adamw_update) and writes the rounded result into param (BF16/F16/F32), in
// one pass; grad may be BF16/F16/F32.
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v,
                         const AdamWStep& s);

}  // namespace trainer::ops
