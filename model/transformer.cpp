#include "model/transformer.h"

#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "model/layers.h"
#include "model/units.h"

namespace trainer {

namespace {
// Carves the parameters unit by unit, each unit padded as model/units.h says;
// without an arena the tensors keep their shapes and no data.
std::vector<Tensor> carve(Arena* arena, const std::vector<ParamInfo>& params,
                          const std::vector<UnitLayout>& units) {
  std::vector<Tensor> out;
  for (const UnitLayout& u : units) {
    for (int i = u.first; i < u.end; ++i) {
      const TensorSpec& s = params[size_t(i)].spec;
      if (arena) {
        out.push_back(arena->alloc(s));
      } else {
        Tensor t;
        t.dtype = s.dtype;
        t.device = Device::CPU;
        t.ndim = int(s.shape.size());
        for (int k = 0; k < t.ndim; ++k) t.shape[size_t(k)] = s.shape[size_t(k)];
        out.push_back(t);
      }
    }
    const size_t used = u.param_offset.empty() ? 0 : u.param_offset.back() +
                        arena_round(params[size_t(u.end - 1)].spec.bytes());
    if (arena && u.bytes > used) arena->alloc({"unit padding", {int64_t((u.bytes - used) / 4)}, DType::F32});
  }
  return out;
}
}  // namespace

void build_model(Model& m, const ModelDims& d, double init_std, Device device, const ModelStorage& storage) {
  build_model(m, single_plan(d, init_std), device, storage);
}

void build_model(Model& m, const ShardingPlan& plan, Device device, const ModelStorage& storage) {
  const ModelDims& d = plan.local;
  m.dims = d;
  m.params = plan.params;
  m.units = plan.units;
  m.unit_index = unit_index(d, m.units);
  const auto& units = m.units;
  const size_t full = units_total_bytes(units);
  m.param_arena = storage.full_params ? Arena("parameters", full, device) : Arena();
  m.grad_arena = storage.full_grads ? Arena("gradients", full, device) : Arena();
  m.param_tensors = carve(storage.full_params ? &m.param_arena : nullptr, m.params, units);
  m.grad_tensors = carve(storage.full_grads ? &m.grad_arena : nullptr, m.params, units);
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
  UnitHooks* h = m.hooks;
  Tensor x0 = a.layers.empty() ? a.x_final : a.layers[0].x_in;
  const UnitIndex& ux = m.unit_index;
  if (h && ux.embedding >= 0) h->forward_begin(m, ux.embedding);
  ops::embedding_forward(x0, a.ids, m.w.tok_embed, false);
  if (!d.llama) ops::embedding_forward(x0, a.pos_ids, m.w.pos_embed, true);
  for (int64_t i = 0; i < d.L; ++i) {
    LayerActs& la = a.layers[i];
    if (h)
      for (int u : ux.layers[size_t(i)]) h->forward_begin(m, u);
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
  if (h && ux.head >= 0) h->forward_begin(m, ux.head);
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
  UnitHooks* h = m.hooks;
  const UnitIndex& ux = m.unit_index;
  // a.logits holds d loss / d logits (written by the fused cross-entropy).
  if (h && ux.head >= 0) h->backward_begin(m, ux.head);
  ops::linear_backward(g.dh, m.gw.lm_head, {}, a.logits, a.hf, m.w.lm_head, false);
  ops::fill(g.dres, 0.f);
  norm_backward(d, g.dres, m.gw.final_norm_w, m.gw.final_norm_b, g.dh, a.x_final,
                m.w.final_norm_w, a.meanf, a.rstdf);
  if (h && ux.head >= 0) h->backward_end(m, ux.head);
  for (int64_t i = d.L - 1; i >= 0; --i) {
    const LayerActs& la = a.layers[i];
    if (h)
      for (int u : ux.layers[size_t(i)]) h->backward_begin(m, u);
    if (d.moe_layer(i))
      moe_block_backward(d, m.w.layers[i], m.gw.layers[i], la, g, aux_grad);
    else
      mlp_block_backward(d, m.w.layers[i], m.gw.layers[i], la, g);
    attention_block_backward(d, m.w.layers[i], m.gw.layers[i], la, g);
    if (h)
      for (int u : ux.layers[size_t(i)]) h->backward_end(m, u);
  }
  if (h && ux.embedding >= 0) h->backward_begin(m, ux.embedding);
  ops::embedding_backward(m.gw.tok_embed, a.ids, g.dres);
  if (!d.llama) ops::embedding_backward(m.gw.pos_embed, a.pos_ids, g.dres);
  if (h && ux.embedding >= 0) h->backward_end(m, ux.embedding);
}

void zero_grads(Model& m) {
  for (const Tensor& t : m.grad_tensors)
    if (!t.empty()) ops::fill(t, 0.f);
}

}  // namespace trainer
