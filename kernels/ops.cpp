// Routes every op to the backend that owns its tensors. Only the CPU backend
// exists so far; a CUDA tensor reaching here is a programming error until the
// CUDA backend registers its kernels.
#include "kernels/ops.h"

#include <string>

#include "kernels/cpu/cpu_ops.h"

namespace trainer::ops {
namespace {
void require_cpu(const Tensor& t, const char* op) {
  if (t.device != Device::CPU)
    throw std::logic_error(std::string(op) + ": no CUDA kernel in this build for tensor " + t.shape_str());
}
}  // namespace

void fill(Tensor t, float value) {
  require_cpu(t, "fill");
  cpu::fill(t, value);
}
void copy(Tensor dst, Tensor src) {
  require_cpu(dst, "copy");
  cpu::copy(dst, src);
}
void add(Tensor out, Tensor a, Tensor b) {
  require_cpu(out, "add");
  cpu::add(out, a, b);
}
void add_inplace(Tensor acc, Tensor x) {
  require_cpu(acc, "add_inplace");
  cpu::add_inplace(acc, x);
}
void scale_inplace(Tensor t, float s) {
  require_cpu(t, "scale_inplace");
  cpu::scale_inplace(t, s);
}
double sum_squares(Tensor x) {
  require_cpu(x, "sum_squares");
  return cpu::sum_squares(x);
}
double sum(Tensor x) {
  require_cpu(x, "sum");
  return cpu::sum(x);
}
void embedding_forward(Tensor out, Tensor ids, Tensor table, bool accumulate) {
  require_cpu(out, "embedding_forward");
  cpu::embedding_forward(out, ids, table, accumulate);
}
void embedding_backward(Tensor dtable, Tensor ids, Tensor dout) {
  require_cpu(dtable, "embedding_backward");
  cpu::embedding_backward(dtable, ids, dout);
}
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  require_cpu(out, "rmsnorm_forward");
  cpu::rmsnorm_forward(out, rstd, x, weight, eps);
}
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd) {
  require_cpu(dx, "rmsnorm_backward");
  cpu::rmsnorm_backward(dx, dweight, dout, x, weight, rstd);
}
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias, float eps) {
  require_cpu(out, "layernorm_forward");
  cpu::layernorm_forward(out, mean, rstd, x, weight, bias, eps);
}
void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  require_cpu(dx, "layernorm_backward");
  cpu::layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd);
}
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  require_cpu(out, "linear_forward");
  cpu::linear_forward(out, inp, weight, bias);
}
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, bool accumulate_dinp) {
  require_cpu(dinp, "linear_backward");
  cpu::linear_backward(dinp, dweight, dbias, dout, inp, weight, accumulate_dinp);
}
void rope_forward(Tensor out, Tensor inp, float theta) {
  require_cpu(out, "rope_forward");
  cpu::rope_forward(out, inp, theta);
}
void rope_backward(Tensor dinp, Tensor dout, float theta) {
  require_cpu(dinp, "rope_backward");
  cpu::rope_backward(dinp, dout, theta);
}
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal) {
  require_cpu(out, "attention_forward");
  cpu::attention_forward(out, lse, q, k, v, causal);
}
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal) {
  require_cpu(dq, "attention_backward");
  cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, causal);
}
void gelu_forward(Tensor out, Tensor inp) {
  require_cpu(out, "gelu_forward");
  cpu::gelu_forward(out, inp);
}
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  require_cpu(dinp, "gelu_backward");
  cpu::gelu_backward(dinp, dout, inp);
}
void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  require_cpu(out, "swiglu_forward");
  cpu::swiglu_forward(out, gate, up);
}
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  require_cpu(dgate, "swiglu_backward");
  cpu::swiglu_backward(dgate, dup, dout, gate, up);
}
void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets, float grad_scale) {
  require_cpu(losses, "cross_entropy_forward_backward");
  cpu::cross_entropy_forward_backward(losses, dlogits, logits, targets, grad_scale);
}
void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool normalize) {
  require_cpu(probs, "moe_route_forward");
  cpu::moe_route_forward(probs, topk_idx, topk_w, logits, normalize);
}
void moe_aux_loss_forward(Tensor aux, Tensor probs, Tensor topk_idx) {
  require_cpu(aux, "moe_aux_loss_forward");
  cpu::moe_aux_loss_forward(aux, probs, topk_idx);
}
void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor topk_w, bool normalize, float aux_grad) {
  require_cpu(dlogits, "moe_route_backward");
  cpu::moe_route_backward(dlogits, dtopk_w, probs, topk_idx, topk_w, normalize, aux_grad);
}
void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts, int capacity) {
  require_cpu(row_map, "moe_dispatch_plan");
  cpu::moe_dispatch_plan(row_map, offsets, topk_idx, num_experts, capacity);
}
void moe_permute(Tensor xp, Tensor x, Tensor row_map) {
  require_cpu(xp, "moe_permute");
  cpu::moe_permute(xp, x, row_map);
}
void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map) {
  require_cpu(dx, "moe_permute_backward");
  cpu::moe_permute_backward(dx, dxp, row_map);
}
void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w) {
  require_cpu(y, "moe_unpermute");
  cpu::moe_unpermute(y, yp, row_map, topk_w);
}
void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map, Tensor topk_w) {
  require_cpu(dyp, "moe_unpermute_backward");
  cpu::moe_unpermute_backward(dyp, dtopk_w, dy, yp, row_map, topk_w);
}
void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets) {
  require_cpu(out, "grouped_linear_forward");
  cpu::grouped_linear_forward(out, inp, weight, offsets);
}
void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets) {
  require_cpu(dinp, "grouped_linear_backward");
  cpu::grouped_linear_backward(dinp, dweight, dout, inp, weight, offsets);
}
void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  require_cpu(param, "adamw_update");
  cpu::adamw_update(param, grad, m, v, s);
}

}  // namespace trainer::ops
