#include "model/transformer.h"

#include <vector>

#include "kernels/device_memory.h"
#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

void build_model(Model& m, const ModelDims& d, double init_std, Device device) {
  m.dims = d;
  m.params = parameter_list(d, init_std);
  const auto pspecs = specs_of(m.params);
  m.param_arena = Arena("parameters", arena_bytes(pspecs), device);
  m.grad_arena = Arena("gradients", arena_bytes(pspecs), device);
  m.param_tensors = m.param_arena.alloc_all(pspecs);
  m.grad_tensors = m.grad_arena.alloc_all(pspecs);
  m.w = bind_weights(d, m.params, m.param_tensors);
  m.gw = bind_weights(d, m.params, m.grad_tensors);
  const auto aspecs = activation_specs(d);
  m.act_arena = Arena("activations", arena_bytes(aspecs), device);
  m.acts = bind_activations(d, aspecs, m.act_arena.alloc_all(aspecs));
  const auto gspecs = grad_scratch_specs(d);
  m.scratch_arena = Arena("gradient scratch", arena_bytes(gspecs), device);
  m.g = bind_grad_scratch(gspecs, m.scratch_arena.alloc_all(gspecs));
  if (!d.llama) {
    // Position ids never change; written once here.
    std::vector<int32_t> pos(size_t(d.N()));
    for (int64_t n = 0; n < d.N(); ++n) pos[size_t(n)] = int32_t(n % d.T);
    write_from_host(m.acts.pos_ids, pos.data());
  }
}

ForwardResult model_forward(Model& m, float ce_grad_scale) {
  const ModelDims& d = m.dims;
  Activations& a = m.acts;
  ForwardResult r;
  Tensor x0 = a.layers.empty() ? a.x_final : a.layers[0].x_in;
  ops::embedding_forward(x0, a.ids, m.w.tok_embed, false);
  if (!d.llama) ops::embedding_forward(x0, a.pos_ids, m.w.pos_embed, true);
  for (int64_t i = 0; i < d.L; ++i) {
    LayerActs& la = a.layers[i];
    const LayerWeights& lw = m.w.layers[i];
    Tensor x_out = i + 1 < d.L ? a.layers[i + 1].x_in : a.x_final;
    attention_block_forward(d, lw, la, la.x_mid);
    if (d.moe_layer(i)) {
      moe_block_forward(d, lw, la, a.moe_out, x_out);
      r.aux_sum += ops::sum(la.aux);
    } else {
      mlp_block_forward(d, lw, la, x_out);
    }
  }
  norm_forward(d, a.hf, a.meanf, a.rstdf, a.x_final, m.w.final_norm_w, m.w.final_norm_b);
  ops::linear_forward(a.logits, a.hf, m.w.lm_head, {});
  ops::cross_entropy_forward_backward(a.losses, ce_grad_scale > 0 ? a.logits : Tensor{}, a.logits,
                                      a.targets, ce_grad_scale);
  r.loss_sum = ops::sum(a.losses);
  return r;
}

void model_backward(Model& m, float aux_grad) {
  const ModelDims& d = m.dims;
  Activations& a = m.acts;
  GradScratch& g = m.g;
  // a.logits holds d loss / d logits (written by the fused cross-entropy).
  ops::linear_backward(g.dh, m.gw.lm_head, {}, a.logits, a.hf, m.w.lm_head, false);
  ops::fill(g.dres, 0.f);
  norm_backward(d, g.dres, m.gw.final_norm_w, m.gw.final_norm_b, g.dh, a.x_final,
                m.w.final_norm_w, a.meanf, a.rstdf);
  for (int64_t i = d.L - 1; i >= 0; --i) {
    const LayerActs& la = a.layers[i];
    if (d.moe_layer(i))
      moe_block_backward(d, m.w.layers[i], m.gw.layers[i], la, g, aux_grad);
    else
      mlp_block_backward(d, m.w.layers[i], m.gw.layers[i], la, g);
    attention_block_backward(d, m.w.layers[i], m.gw.layers[i], la, g);
  }
  ops::embedding_backward(m.gw.tok_embed, a.ids, g.dres);
  if (!d.llama) ops::embedding_backward(m.gw.pos_embed, a.pos_ids, g.dres);
}

void zero_grads(Model& m) {
  for (const Tensor& t : m.grad_tensors) ops::fill(t, 0.f);
}

}  // namespace trainer
