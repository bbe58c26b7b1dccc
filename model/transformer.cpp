#include "model/transformer.h"

#include <vector>

#include "core/device_memory.h"
#include "core/trace.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "model/expert_load.h"
#include "model/layers.h"
#include "model/recompute.h"
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

// shared: what recomputing layers leave out of every slot (model/recompute.h).
std::unique_ptr<ActivationSlot> make_slot(const ModelDims& d, Device device, const LayerActs& shared) {
  auto slot = std::make_unique<ActivationSlot>();
  const auto specs = activation_specs(d);
  slot->arena = Arena("activations", arena_bytes(specs), device);
  const std::vector<Tensor> tensors = slot->arena.alloc_all(specs);
  slot->acts = bind_activations(d, specs, tensors, shared);
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == "dx") slot->dx = tensors[i];
  if (!d.llama) {
    // Position ids never change; written once per slot.
    std::vector<int32_t> pos(size_t(d.N()));
    // The tokens' places in the whole sequence (zigzag chunks under cp).
    const std::vector<int32_t> place = d.cp > 1 ? zigzag_positions(d.T * d.cp, d.cp, d.cp_rank) : std::vector<int32_t>{};
    for (int64_t n = 0; n < d.N(); ++n) pos[size_t(n)] = d.cp > 1 ? place[size_t(n % d.T)] : int32_t(n % d.T);
    write_from_host(slot->acts.pos_ids, pos.data());
  }
  return slot;
}

ActivationSlot& slot_of(Model& m, int64_t mb) {
  for (auto& s : m.slots)
    if (s->mb == mb) return *s;
  throw std::logic_error("micro-batch " + std::to_string(mb) + " holds no activation slot (acquire_activations first)");
}

TensorParallel tp_of(Model& m) {
  TensorParallel tp;
  tp.group = m.tp ? m.tp : &solo_tp(model_device(m));
  tp.full = m.g.tp_full;
  tp.gathered = m.g.tp_gathered;
  if (tp.size() != m.dims.tp)
    throw std::logic_error("the model is split for tp=" + std::to_string(m.dims.tp) + ", its tensor-parallel group " +
                           tp.comm().describe() + " has " + std::to_string(tp.size()) + " rank(s)");
  return tp;
}

Communicator& solo_cp(Device device) {
  static SingleRankCommunicator cpu("cp", 0, Device::CPU), cuda("cp", 0, Device::CUDA);
  return device == Device::CPU ? cpu : cuda;
}

ContextParallel cp_of(Model& m) {
  ContextParallel cp;
  cp.group = m.cp ? m.cp : &solo_cp(model_device(m));
  cp.overlap = m.overlap_comm;
  if (cp.size() != m.dims.cp)
    throw std::logic_error("the model is split for cp=" + std::to_string(m.dims.cp) + ", its context-parallel group " +
                           cp.group->describe() + " has " + std::to_string(cp.size()) + " rank(s)");
  const GradScratch& g = m.g;
  cp.positions = g.cp_positions;
  cp.k[0] = g.cp_k0;
  cp.k[1] = g.cp_k1;
  cp.v[0] = g.cp_v0;
  cp.v[1] = g.cp_v1;
  cp.dk[0] = g.cp_dk0;
  cp.dk[1] = g.cp_dk1;
  cp.dv[0] = g.cp_dv0;
  cp.dv[1] = g.cp_dv1;
  cp.part_o = g.cp_o;
  cp.part_lse = g.cp_lse;
  cp.moe_all_rows = g.cp_moe_all_rows;
  cp.moe_all_idx = g.cp_moe_all_idx;
  cp.moe_all_offsets = g.cp_moe_all_offsets;
  cp.moe_admitted = g.cp_moe_admitted;
  return cp;
}

Communicator& solo_ep(Device device) {
  static SingleRankCommunicator cpu("ep", 0, Device::CPU), cuda("ep", 0, Device::CUDA);
  return device == Device::CPU ? cpu : cuda;
}

Communicator& ep_of(Model& m) {
  Communicator& ep = m.ep ? *m.ep : solo_ep(model_device(m));
  if (ep.size() != m.dims.ep)
    throw std::logic_error("the model's experts are split for ep=" + std::to_string(m.dims.ep) +
                           ", its expert-parallel group " + ep.describe() + " has " + std::to_string(ep.size()) +
                           " rank(s)");
  return ep;
}

}  // namespace

void build_model(Model& m, const ModelDims& d, double init_std, Device device, const ModelStorage& storage) {
  build_model(m, single_plan(d, init_std), device, storage);
}

void build_model(Model& m, const ShardingPlan& plan, Device device, const ModelStorage& storage) {
  const ModelDims& d = plan.local;
  m.dims = d;
  m.params = plan.params;
  m.placement = plan.placement;
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
  const auto gspecs = grad_scratch_specs(d);
  m.scratch_arena = Arena("gradient scratch", arena_bytes(gspecs), device);
  m.g = bind_grad_scratch(gspecs, m.scratch_arena.alloc_all(gspecs));
  m.slots.clear();
  m.slots.push_back(make_slot(d, device, m.g.recompute));
  m.acts = m.slots[0]->acts;
  if (d.cp > 1) {
    std::vector<int32_t> all;
    for (int r = 0; r < d.cp; ++r) {
      const std::vector<int32_t> p = zigzag_positions(d.T * d.cp, d.cp, r);
      all.insert(all.end(), p.begin(), p.end());
    }
    write_from_host(m.g.cp_positions, all.data());
  }
}

Device model_device(const Model& m) { return m.scratch_arena.device(); }

void reserve_activation_slots(Model& m, int n) {
  while (int(m.slots.size()) < n) m.slots.push_back(make_slot(m.dims, m.scratch_arena.device(), m.g.recompute));
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
  const trace::Scope span("forward", "embedding", -1, mb.id);
  if (m.hooks) m.hooks->forward_begin(m, u, mb);
  const TensorParallel tp = tp_of(m);
  const Tensor x0 = stage_input(m, mb.id);
  // Vocabulary-parallel: each tp rank looks up the ids of its vocabulary
  // shard (zero rows for the others), so the whole sequence's output is a
  // partial sum over tp: a row output. tp rank 0 adds the positions, once.
  const Tensor y = row_partial(d, tp, x0);
  ops::embedding_forward(y, a.ids, m.w.tok_embed, false, d.V_offset, d.vocab());
  if (!d.llama && tp.rank() == 0) ops::embedding_forward(y, a.pos_ids, m.w.pos_embed, true, 0, d.max_seq);
  row_output(d, tp, x0, y);
}

double blocks_forward(Model& m, const MicroBatch& mb, int64_t first, int64_t count) {
  const ModelDims& d = m.dims;
  Activations& a = activations_of(m, mb.id);
  const TensorParallel tp = tp_of(m);
  const ContextParallel cp = cp_of(m);
  double aux = 0;
  for (int64_t i = first; i < first + count; ++i) {
    LayerActs& la = a.layers[size_t(i)];
    const trace::Scope span("forward", "layer", d.first_layer + i, mb.id);
    if (m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->forward_begin(m, u, mb);
    const LayerWeights& lw = m.w.layers[size_t(i)];
    const Tensor x_out = i + 1 < d.L ? a.layers[size_t(i + 1)].x_in : a.x_final;
    attention_block_forward(d, tp, cp, lw, la, la.x_mid);
    if (d.moe_layer(i)) {
      moe_block_forward(d, tp, cp, ep_of(m), lw, la, a.moe_out, x_out);
      if (m.expert_load) count_expert_load(d, i, la, *m.expert_load);
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
  const trace::Scope span("forward", "head", -1, mb.id);
  if (m.hooks) m.hooks->forward_begin(m, u, mb);
  const TensorParallel tp = tp_of(m);
  norm_forward(d, a.hf, a.meanf, a.rstdf, a.x_final, m.w.final_norm_w, m.w.final_norm_b);
  // logits [N, V / tp]: this rank's vocabulary shard; no rank holds all of them.
  ops::linear_forward(a.logits, column_input(d, tp, a.hf), m.w.lm_head, {});
  const Tensor dlogits = ce_grad_scale > 0 ? a.logits : Tensor{};
  if (tp.size() == 1) {
    ops::cross_entropy_forward_backward(a.losses, dlogits, a.logits, a.targets, ce_grad_scale);
  } else {
    // Per token (max, sum-exp, target logit) of each shard, gathered, give
    // every rank the whole vocabulary's log-sum-exp: one all-gather of 3
    // floats per token and rank instead of the logits.
    const Tensor all = m.g.ce_stats;
    const Tensor mine = all.view({int64_t(tp.size()), d.N() * 3}).slice0(tp.rank(), tp.rank() + 1).view({d.N(), 3});
    ops::cross_entropy_partial_stats(mine, a.logits, a.targets, d.V_offset, d.V_valid(), d.vocab());
    tp.comm().all_gather(all, mine);
    ops::cross_entropy_vocab_parallel(a.losses, dlogits, a.logits, a.targets, all, d.V_offset, d.V_valid(),
                                      ce_grad_scale);
  }
  ForwardResult r;
  r.loss_sum = ops::sum(a.losses);
  return r;
}

void head_backward(Model& m, const MicroBatch& mb, BackwardPart part) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  const Activations& a = s.acts;
  GradScratch& g = m.g;
  const int u = m.unit_index.head;
  if (u < 0) throw std::logic_error("head_backward: this pipeline stage holds no head");
  const trace::Scope span("backward", "head", -1, mb.id);
  // a.logits holds d loss / d logits (written by the fused cross-entropy);
  // it stays in the slot for the weight half of a split backward.
  if (m.hooks) m.hooks->backward_begin(m, u, mb);
  const TensorParallel tp = tp_of(m);
  ops::linear_backward(g.dh, {}, {}, a.logits, column_input_shape(d, tp, a.hf), m.w.lm_head, false);
  const Tensor dh = column_input_grad(d, tp, g.dh);  // summed over the vocabulary shards
  if (part == BackwardPart::Whole)
    ops::linear_backward({}, m.gw.lm_head, {}, a.logits, column_input(d, tp, a.hf), m.w.lm_head, false);
  ops::fill(s.dx, 0.f);
  norm_backward(d, s.dx, m.gw.final_norm_w, m.gw.final_norm_b, dh, a.x_final, m.w.final_norm_w, a.meanf,
                a.rstdf);
  if (part == BackwardPart::Whole && m.hooks) m.hooks->backward_end(m, u, mb);
}

void head_backward_weight(Model& m, const MicroBatch& mb) {
  const Activations& a = slot_of(m, mb.id).acts;
  const int u = m.unit_index.head;
  if (u < 0) throw std::logic_error("head_backward_weight: this pipeline stage holds no head");
  const trace::Scope span("backward", "head weights", -1, mb.id);
  ops::linear_backward({}, m.gw.lm_head, {}, a.logits, column_input(m.dims, tp_of(m), a.hf), m.w.lm_head, false);
  if (m.hooks) m.hooks->backward_end(m, u, mb);
}

void blocks_backward(Model& m, const MicroBatch& mb, int64_t first, int64_t count, float aux_grad, BackwardPart part) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  if (part == BackwardPart::Input && !d.split_backward)
    throw std::logic_error("blocks_backward: a split backward needs a model built with split_backward (its slots keep "
                           "the output gradients)");
  const TensorParallel tp = tp_of(m);
  const ContextParallel cp = cp_of(m);
  GradScratch g = m.g;
  g.dres = s.dx;
  for (int64_t i = first + count - 1; i >= first; --i) {
    LayerActs& la = s.acts.layers[size_t(i)];
    const LayerWeights& w = m.w.layers[size_t(i)];
    const LayerWeights& gw = m.gw.layers[size_t(i)];
    const trace::Scope span("backward", "layer", d.first_layer + i, mb.id);
    if (m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->backward_begin(m, u, mb);
    // After the hooks: under ZeRO-3 they gathered the weights the recompute reads.
    // The norm-gradient scratch is free between layers.
    if (d.recompute_of(i) != Recompute::None)
      recompute_layer(d, d.recompute_of(i), d.moe_layer(i), tp, cp, ep_of(m), w, la, s.acts.moe_out, g.dh);
    if (d.moe_layer(i))
      moe_block_backward(d, tp, ep_of(m), w, gw, la, g, aux_grad, part);
    else
      mlp_block_backward(d, tp, w, gw, la, g, part);
    attention_block_backward(d, tp, cp, w, gw, la, g, part);
    if (part == BackwardPart::Whole && m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->backward_end(m, u, mb);
  }
}

void blocks_backward_weight(Model& m, const MicroBatch& mb, int64_t first, int64_t count) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  const TensorParallel tp = tp_of(m);
  // Layer after layer in the backward's order, so that gradient reductions
  // start in the same unit order as after a whole backward.
  for (int64_t i = first + count - 1; i >= first; --i) {
    const LayerActs& la = s.acts.layers[size_t(i)];
    const LayerWeights& w = m.w.layers[size_t(i)];
    const LayerWeights& gw = m.gw.layers[size_t(i)];
    const trace::Scope span("backward", "layer weights", d.first_layer + i, mb.id);
    if (d.moe_layer(i))
      moe_block_backward_weight(d, tp, w, gw, la, la.stash);
    else
      mlp_block_backward_weight(d, tp, w, gw, la, la.stash);
    attention_block_backward_weight(d, tp, w, gw, la, la.stash);
    if (m.hooks)
      for (int u : m.unit_index.layers[size_t(i)]) m.hooks->backward_end(m, u, mb);
  }
}

void embedding_backward(Model& m, const MicroBatch& mb) {
  const ModelDims& d = m.dims;
  ActivationSlot& s = slot_of(m, mb.id);
  const int u = m.unit_index.embedding;
  if (u < 0) throw std::logic_error("embedding_backward: this pipeline stage holds no embedding");
  const trace::Scope span("backward", "embedding", -1, mb.id);
  if (m.hooks) m.hooks->backward_begin(m, u, mb);
  const TensorParallel tp = tp_of(m);
  // The whole sequence's gradient: each rank updates its vocabulary rows,
  // and every rank the whole (replicated) position table.
  const Tensor dy = row_output_grad(d, tp, s.dx);
  ops::embedding_backward(m.gw.tok_embed, s.acts.ids, dy, d.V_offset, d.vocab());
  if (!d.llama) ops::embedding_backward(m.gw.pos_embed, s.acts.pos_ids, dy, 0, d.max_seq);
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
