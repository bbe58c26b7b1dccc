// Routes every op to the backend that owns its tensors: kernels/cpu for host
// tensors, kernels/cuda for device tensors (when the CUDA backend is built).
#include "kernels/ops.h"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cpu/cpu_ops.h"
#include "core/device_memory.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace trainer::ops {
#ifndef TRAINER_HAVE_CUDA
namespace {
[[noreturn]] void no_cuda(const char* op) {
  throw std::logic_error(std::string(op) + ": a CUDA tensor reached an op, but this build has no CUDA backend");
}
}  // namespace
#endif

// The backend is chosen by the first tensor argument that is present: some
// outputs are optional (an empty dinp, dbias) and an empty Tensor says "CPU".
template <typename... Ts>
Tensor first_present(const Ts&... ts) {
  Tensor found;
  auto take = [&](const auto& t) {
    if constexpr (std::is_same_v<std::decay_t<decltype(t)>, Tensor>)
      if (found.empty() && !t.empty()) found = t;
  };
  (take(ts), ...);
  return found;
}

#ifdef TRAINER_HAVE_CUDA
#define ROUTE(first, op, ...) \
  return (first).device == Device::CUDA ? cuda::op(__VA_ARGS__) : cpu::op(__VA_ARGS__)
#else
#define ROUTE(first, op, ...)                   \
  if ((first).device == Device::CUDA) no_cuda(#op); \
  return cpu::op(__VA_ARGS__)
#endif

void fill(Tensor t, float value) {
  ROUTE(first_present(t, value), fill, t, value);
}
void copy(Tensor dst, Tensor src) {
  if (dst.device != src.device) return copy_between_devices(dst, src);
  ROUTE(first_present(dst, src), copy, dst, src);
}
void add(Tensor out, Tensor a, Tensor b) {
  ROUTE(first_present(out, a, b), add, out, a, b);
}
void add_inplace(Tensor acc, Tensor x) {
  ROUTE(first_present(acc, x), add_inplace, acc, x);
}
void scale_inplace(Tensor t, float s) {
  ROUTE(first_present(t, s), scale_inplace, t, s);
}
void convert(Tensor dst, Tensor src) {
  if (dst.device != src.device) return copy_between_devices(dst, src);
  ROUTE(first_present(dst, src), convert, dst, src);
}
double sum_squares(Tensor x) {
  ROUTE(first_present(x), sum_squares, x);
}
double sum(Tensor x) {
  ROUTE(first_present(x), sum, x);
}
void embedding_forward(Tensor out, Tensor ids, Tensor table, bool accumulate) {
  ROUTE(first_present(out, ids, table, accumulate), embedding_forward, out, ids, table, accumulate);
}
void embedding_backward(Tensor dtable, Tensor ids, Tensor dout) {
  ROUTE(first_present(dtable, ids, dout), embedding_backward, dtable, ids, dout);
}
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  ROUTE(first_present(out, rstd, x, weight, eps), rmsnorm_forward, out, rstd, x, weight, eps);
}
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd) {
  ROUTE(first_present(dx, dweight, dout, x, weight, rstd), rmsnorm_backward, dx, dweight, dout, x, weight, rstd);
}
void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias, float eps) {
  ROUTE(first_present(out, mean, rstd, x, weight, bias, eps), layernorm_forward, out, mean, rstd, x, weight, bias, eps);
}
void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  ROUTE(first_present(dx, dweight, dbias, dout, x, weight, mean, rstd), layernorm_backward, dx, dweight, dbias, dout, x, weight, mean, rstd);
}
void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  ROUTE(first_present(out, inp, weight, bias), linear_forward, out, inp, weight, bias);
}
void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight, bool accumulate_dinp) {
  ROUTE(first_present(dinp, dweight, dbias, dout, inp, weight, accumulate_dinp), linear_backward, dinp, dweight, dbias, dout, inp, weight, accumulate_dinp);
}
void rope_forward(Tensor out, Tensor inp, float theta) {
  ROUTE(first_present(out, inp, theta), rope_forward, out, inp, theta);
}
void rope_backward(Tensor dinp, Tensor dout, float theta) {
  ROUTE(first_present(dinp, dout, theta), rope_backward, dinp, dout, theta);
}
void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal) {
  ROUTE(first_present(out, lse, q, k, v, causal), attention_forward, out, lse, q, k, v, causal);
}
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal) {
  ROUTE(first_present(dq, dk, dv, dout, q, k, v, out, lse, causal), attention_backward, dq, dk, dv, dout, q, k, v, out, lse, causal);
}
void gelu_forward(Tensor out, Tensor inp) {
  ROUTE(first_present(out, inp), gelu_forward, out, inp);
}
void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  ROUTE(first_present(dinp, dout, inp), gelu_backward, dinp, dout, inp);
}
void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  ROUTE(first_present(out, gate, up), swiglu_forward, out, gate, up);
}
void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  ROUTE(first_present(dgate, dup, dout, gate, up), swiglu_backward, dgate, dup, dout, gate, up);
}
void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets, float grad_scale) {
  ROUTE(first_present(losses, dlogits, logits, targets, grad_scale), cross_entropy_forward_backward, losses, dlogits, logits, targets, grad_scale);
}
void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool normalize) {
  ROUTE(first_present(probs, topk_idx, topk_w, logits, normalize), moe_route_forward, probs, topk_idx, topk_w, logits, normalize);
}
void moe_aux_loss_forward(Tensor aux, Tensor probs, Tensor topk_idx) {
  ROUTE(first_present(aux, probs, topk_idx), moe_aux_loss_forward, aux, probs, topk_idx);
}
void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor topk_w, bool normalize, float aux_grad) {
  ROUTE(first_present(dlogits, dtopk_w, probs, topk_idx, topk_w, normalize, aux_grad), moe_route_backward, dlogits, dtopk_w, probs, topk_idx, topk_w, normalize, aux_grad);
}
void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts, int capacity) {
  ROUTE(first_present(row_map, offsets, topk_idx, num_experts, capacity), moe_dispatch_plan, row_map, offsets, topk_idx, num_experts, capacity);
}
void moe_permute(Tensor xp, Tensor x, Tensor row_map) {
  ROUTE(first_present(xp, x, row_map), moe_permute, xp, x, row_map);
}
void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map) {
  ROUTE(first_present(dx, dxp, row_map), moe_permute_backward, dx, dxp, row_map);
}
void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w) {
  ROUTE(first_present(y, yp, row_map, topk_w), moe_unpermute, y, yp, row_map, topk_w);
}
void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map, Tensor topk_w) {
  ROUTE(first_present(dyp, dtopk_w, dy, yp, row_map, topk_w), moe_unpermute_backward, dyp, dtopk_w, dy, yp, row_map, topk_w);
}
void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets) {
  ROUTE(first_present(out, inp, weight, offsets), grouped_linear_forward, out, inp, weight, offsets);
}
void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets) {
  ROUTE(first_present(dinp, dweight, dout, inp, weight, offsets), grouped_linear_backward, dinp, dweight, dout, inp, weight, offsets);
}
void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  ROUTE(first_present(param, grad, m, v, s), adamw_update, param, grad, m, v, s);
}
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  ROUTE(first_present(param, master, grad, m, v, s), adamw_update_master, param, master, grad, m, v, s);
}

}  // namespace trainer::ops
