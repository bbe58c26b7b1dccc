#include "model/transformer.h"

#include <vector>

#include "core/device_memory.h"
#include "kernels/ops.h"
#include "model/layers.h"
#include "model/units.h"

#include <stdexcept>
#include <string>

#include "comm/process_group.h"

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

// The group of one that blocks use when no tensor-parallel group is given.
Communicator& solo_tp(Device device) {
  static SingleRankCommunicator cpu("tp", 0, Device::CPU), cuda("tp", 0, Device::CUDA);
  return device == Device::CPU ? cpu : cuda;
}

std::unique_ptr<ActivationSlot> make_slot(const ModelDims& d, Device device) {
  auto slot = std::make_unique<ActivationSlot>();
  const auto specs = activation_specs(d);
  slot->arena = Arena("activations", arena_bytes(specs), device);
  const std::vector<Tensor> tensors = slot->arena.alloc_all(specs);
  slot->acts = bind_activations(d, specs, tensors);
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == "dx") slot->dx = tensors[i];
  if (!d.llama) {
    // Position ids never change; written once per slot.
    std::vector<int32_t> pos(size_t(d.N()));
    for (int64_t n = 0; n < d.N(); ++n) pos[size_t(n)] = int32_t(n % d.T);
    write_from_host(slot->acts.pos_ids, pos.data());
  }
  return slot;
}

ActivationSlot& slot_of(Model& m, int64_t mb) {
  for (auto& s : m.slots)
    if (s->mb == mb) return *s;
  throw std::logic_error("micro-batch " + std::to_string(mb) + " holds no activation slot (acquire_activations first)");
}

Communicator& tp_of(Model& m) { return m.tp ? *m.tp : solo_tp(model_device(m)); }

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
  m.slots.clear();
  m.slots.push_back(make_slot(d, device));
  m.acts = m.slots[0]->acts;
  const auto gspecs = grad_scratch_specs(d);
  m.scratch_arena = Arena("gradient scratch", arena_bytes(gspecs), device);
  m.g = bind_grad_scratch(gspecs, m.scratch_arena.alloc_all(gspecs));
}

Device model_device(const Model& m) { return m.scratch_arena.device(); }

void reserve_activation_slots(Model& m, int n) {
  while (int(m.slots.size()) < n) m.slots.push_back(make_slot(m.dims, m.scratch_arena.device()));
}

Activations& acquire_activations(Model& m, int64_t mb) {
  for (auto& s : m.slots)
    if (s->mb == mb) return s->acts;
  for (auto& s : m.slots)
    if (s->mb < 0) {
      s->mb = mb;
      return s->acts;
    }
  std::string held;
  for (auto& s : m.slots) held += (held.empty() ? "" : ", ") + std::to_string(s->mb);
  throw std::logic_error("no activation slot is free for micro-batch " + std::to_string(mb) + ": " +
                         std::to_string(m.slots.size()) + " slot(s) hold micro-batches " + held +
                         " (reserve_activation_slots for the schedule's micro-batches in flight)");
}

Activations& activations_of(Model& m, int64_t mb) { return slot_of(m, mb).acts; }

void release_activations(Model& m, int64_t mb) {
  for (auto& s : m.slots)
    if (s->mb == mb) s->mb = -1;
}

Tensor stage_input(Model& m, int64_t mb) {
  Activations& a = activations_of(m, mb);
  return a.layers.empty() ? a.x_final : a.layers[0].x_in;
}
Tensor stage_output(Model& m, int64_t mb) { return activations_of(m, mb).x_final; }
Tensor activation_grad(Model& m, int64_t mb) { return slot_of(m, mb).dx; }

void embedding_forward(Model& m, const MicroBatch& mb) {
  const ModelDims& d = m.dims;
  Activations& a = activations_of(m, mb.id);
  const int u = m.unit_index.embedding;
  if (u < 0) throw std::logic_error("embedding_forward: this pipeline stage holds no embedding");
  if (m.hooks) m.hooks->forward_begin(m, u, mb);
  const Tensor x0 = stage_input(m, mb.id);
  ops::embedding_forward(x0, a.ids, m.w.tok_embed, false, 0, d.V);
  if (!d.llama) ops::embedding_forward(x0, a.pos_ids, m.w.pos_embed, true, 0, m.w.pos_embed.dim(0));
}

double blocks_forward(Model& m, const MicroBatch& mb, int64_t first, int64_t count) {
  const ModelDims& d = m.dims;
  Activations& a = activations_of(m, mb.id);
  Communicator& tp = tp_of(m);
  double aux = 0;
  for (int64_t i = first; i < first + count; ++i) {
    LayerActs& la = a.layers[size_t(i)];
    if (m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->forward_begin(m, u, mb);
    const LayerWeights& lw = m.w.layers[size_t(i)];
    const Tensor x_out = i + 1 < d.L ? a.layers[size_t(i + 1)].x_in : a.x_final;
    attention_block_forward(d, tp, lw, la, la.x_mid);
    if (d.moe_layer(i)) {
      moe_block_forward(d, tp, lw, la, a.moe_out, x_out);
      aux += ops::sum(la.aux);
    } else {
      mlp_block_forward(d, tp, lw, la, x_out);
    }
  }
  return aux;
}

ForwardResult head_forward(Model& m, const MicroBatch& mb, float ce_grad_scale) {
  const ModelDims& d = m.dims;
  Activations& a = activations_of(m, mb.id);
  const int u = m.unit_index.head;
  if (u < 0) throw std::logic_error("head_forward: this pipeline stage holds no head");
  if (m.hooks) m.hooks->forward_begin(m, u, mb);
  norm_forward(d, a.hf, a.meanf, a.rstdf, a.x_final, m.w.final_norm_w, m.w.final_norm_b);
  ops::linear_forward(a.logits, a.hf, m.w.lm_head, {});
  ops::cross_entropy_forward_backward(a.losses, ce_grad_scale > 0 ? a.logits : Tensor{}, a.logits,
                                      a.targets, ce_grad_scale);
  ForwardResult r;
  r.loss_sum = ops::sum(a.losses);
  return r;
}

void head_backward(Model& m, const MicroBatch& mb) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  const Activations& a = s.acts;
  GradScratch& g = m.g;
  const int u = m.unit_index.head;
  if (u < 0) throw std::logic_error("head_backward: this pipeline stage holds no head");
  // a.logits holds d loss / d logits (written by the fused cross-entropy).
  if (m.hooks) m.hooks->backward_begin(m, u, mb);
  ops::linear_backward(g.dh, {}, {}, a.logits, a.hf, m.w.lm_head, false);
  ops::linear_backward({}, m.gw.lm_head, {}, a.logits, a.hf, m.w.lm_head, false);
  ops::fill(s.dx, 0.f);
  norm_backward(d, s.dx, m.gw.final_norm_w, m.gw.final_norm_b, g.dh, a.x_final, m.w.final_norm_w, a.meanf,
                a.rstdf);
  if (m.hooks) m.hooks->backward_end(m, u, mb);
}

void blocks_backward(Model& m, const MicroBatch& mb, int64_t first, int64_t count, float aux_grad) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  Communicator& tp = tp_of(m);
  GradScratch g = m.g;
  g.dres = s.dx;
  for (int64_t i = first + count - 1; i >= first; --i) {
    const LayerActs& la = s.acts.layers[size_t(i)];
    if (m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->backward_begin(m, u, mb);
    if (d.moe_layer(i))
      moe_block_backward(d, tp, m.w.layers[size_t(i)], m.gw.layers[size_t(i)], la, g, aux_grad);
    else
      mlp_block_backward(d, tp, m.w.layers[size_t(i)], m.gw.layers[size_t(i)], la, g);
    attention_block_backward(d, tp, m.w.layers[size_t(i)], m.gw.layers[size_t(i)], la, g);
    if (m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->backward_end(m, u, mb);
  }
}

void embedding_backward(Model& m, const MicroBatch& mb) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  const int u = m.unit_index.embedding;
  if (u < 0) throw std::logic_error("embedding_backward: this pipeline stage holds no embedding");
  if (m.hooks) m.hooks->backward_begin(m, u, mb);
  ops::embedding_backward(m.gw.tok_embed, s.acts.ids, s.dx, 0, d.V);
  if (!d.llama) ops::embedding_backward(m.gw.pos_embed, s.acts.pos_ids, s.dx, 0, m.gw.pos_embed.dim(0));
  if (m.hooks) m.hooks->backward_end(m, u, mb);
}

ForwardResult model_forward(Model& m, float ce_grad_scale, const MicroBatch& mb) {
  const ModelDims& d = m.dims;
  acquire_activations(m, mb.id);
  ForwardResult r;
  if (d.has_embedding) embedding_forward(m, mb);
  r.aux_sum = blocks_forward(m, mb, 0, d.L);
  if (d.has_head) r.loss_sum = head_forward(m, mb, ce_grad_scale).loss_sum;
  if (!(ce_grad_scale > 0)) release_activations(m, mb.id);  // no backward follows
  return r;
}

void model_backward(Model& m, float aux_grad, const MicroBatch& mb) {
  const ModelDims& d = m.dims;
  if (d.has_head) head_backward(m, mb);
  blocks_backward(m, mb, 0, d.L, aux_grad);
  if (d.has_embedding) embedding_backward(m, mb);
  release_activations(m, mb.id);
}

void zero_grads(Model& m) {
  for (const Tensor& t : m.grad_tensors)
    if (!t.empty()) ops::fill(t, 0.f);
}

}  // namespace trainer
