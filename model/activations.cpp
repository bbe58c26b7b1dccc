#include "model/activations.h"

#include <stdexcept>
#include <unordered_map>

namespace trainer {

namespace {
using Shape = std::vector<int64_t>;

std::unordered_map<std::string, Tensor> by_name(const std::vector<TensorSpec>& specs,
                                                const std::vector<Tensor>& tensors) {
  if (specs.size() != tensors.size()) throw std::logic_error("bind: spec/tensor count mismatch");
  std::unordered_map<std::string, Tensor> m;
  for (size_t i = 0; i < specs.size(); ++i) m[specs[i].name] = tensors[i];
  return m;
}
}  // namespace

std::vector<TensorSpec> activation_specs(const ModelDims& d) {
  // R: this rank's token rows of the residual stream (N / tp under sequence
  // parallelism), where norms and residual adds run; the norm outputs feed
  // column-parallel linears and hold the whole sequence.
  const int64_t N = d.N(), R = d.rows(), C = d.C, FF = d.F;
  std::vector<TensorSpec> s;
  // Activations use the storage type; statistics read back or reduced
  // across tokens stay F32; indices are I32.
  const DType A = d.act, F = DType::F32;
  auto add = [&](std::string n, Shape sh, DType t) { s.push_back({std::move(n), std::move(sh), t}); };
  add("ids", {N}, DType::I32);
  add("targets", {N}, DType::I32);
  if (!d.llama) add("pos_ids", {N}, DType::I32);
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    add(p + "x_in", {R, C}, A);
    add(p + "h1", {N, C}, A);
    if (!d.llama) add(p + "mean1", {R}, F);
    add(p + "rstd1", {R}, F);
    add(p + "q", {d.B, d.T, d.Hq, d.D}, A);
    add(p + "k", {d.B, d.T, d.Hkv, d.D}, A);
    add(p + "v", {d.B, d.T, d.Hkv, d.D}, A);
    add(p + "o", {N, d.Hq * d.D}, A);
    add(p + "lse", {d.B, d.Hq, d.T}, F);
    add(p + "x_mid", {R, C}, A);
    add(p + "h2", {N, C}, A);
    if (!d.llama) add(p + "mean2", {R}, F);
    add(p + "rstd2", {R}, F);
    if (d.moe_layer(i)) {
      const int64_t NK = N * d.K;
      add(p + "rlogits", {N, d.E}, A);
      add(p + "probs", {N, d.E}, F);
      add(p + "topk_idx", {N, d.K}, DType::I32);
      add(p + "topk_w", {N, d.K}, F);
      add(p + "row_map", {N, d.K}, DType::I32);
      add(p + "offsets", {d.E + 1}, DType::I32);
      add(p + "aux", {1}, F);
      const int64_t R = d.expert_rows();
      add(p + "xp", {NK, C}, A);
      add(p + "e1", {R, d.Fm}, A);
      if (d.llama) add(p + "e2", {R, d.Fm}, A);
      add(p + "eact", {R, d.Fm}, A);
      add(p + "yp", {NK, C}, A);
      if (d.ep > 1) {
        add(p + "xe", {R, C}, A);
        add(p + "ye", {R, C}, A);
        add(p + "ep_gather", {int64_t(d.ep), d.E + 1}, DType::I32);
        add(p + "ep_offsets", {int64_t(d.ep), d.experts_here() + 1}, DType::I32);
      }
    } else {
      add(p + "a1", {N, FF}, A);
      if (d.llama) add(p + "a2", {N, FF}, A);
      add(p + "act", {N, FF}, A);
    }
    if (d.split_backward) {
      // Whole-sequence gradients: the weight gradients sum over every token.
      add(p + "stash.attn_dy", {N, C}, A);
      add(p + "stash.dq", {d.B, d.T, d.Hq, d.D}, A);
      add(p + "stash.dk", {d.B, d.T, d.Hkv, d.D}, A);
      add(p + "stash.dv", {d.B, d.T, d.Hkv, d.D}, A);
      if (d.moe_layer(i)) {
        const int64_t R = d.expert_rows();
        add(p + "stash.dyp", {R, C}, A);
        add(p + "stash.de1", {R, d.Fm}, A);
        if (d.llama) add(p + "stash.de2", {R, d.Fm}, A);
        add(p + "stash.drlogits", {N, d.E}, A);
      } else {
        add(p + "stash.mlp_dy", {N, C}, A);
        add(p + "stash.d1", {N, FF}, A);
        if (d.llama) add(p + "stash.d2", {N, FF}, A);
      }
    }
  }
  add("x_final", {R, C}, A);
  add("hf", {N, C}, A);
  if (!d.llama) add("meanf", {R}, F);
  add("rstdf", {R}, F);
  add("logits", {N, d.V}, A);
  add("losses", {N}, F);
  if (d.E > 0) add("moe_out", {N, C}, A);
  // The residual-stream gradient at the stage boundary (model/transformer.h).
  add("dx", {R, C}, A);
  return s;
}

std::vector<TensorSpec> grad_scratch_specs(const ModelDims& d) {
  const int64_t N = d.N(), C = d.C;
  std::vector<TensorSpec> s;
  auto add = [&](std::string n, Shape sh, DType t) { s.push_back({std::move(n), std::move(sh), t}); };
  const DType A = d.act;
  add("dh", {N, C}, A);
  // Sequence parallelism: a whole-sequence [N, C] buffer (model/tensor_parallel.h).
  if (d.sp) add("tp_full", {N, C}, A);
  // Vocabulary-parallel cross-entropy: every rank's per-token (max, sum-exp,
  // target logit) of its vocabulary shard, gathered.
  if (d.tp > 1 && d.has_head) add("ce_stats", {int64_t(d.tp), N, 3}, DType::F32);
  add("dq", {d.B, d.T, d.Hq, d.D}, A);
  add("dk", {d.B, d.T, d.Hkv, d.D}, A);
  add("dv", {d.B, d.T, d.Hkv, d.D}, A);
  add("dout", {N, d.Hq * d.D}, A);
  if (d.cp > 1) {
    add("cp_positions", {int64_t(d.cp), d.T}, DType::I32);
    for (const char* n : {"cp_k0", "cp_k1", "cp_v0", "cp_v1", "cp_dk0", "cp_dk1", "cp_dv0", "cp_dv1"})
      add(n, {d.B, d.T, d.Hkv, d.D}, A);
    add("cp_o", {d.B, d.T, d.Hq, d.D}, A);
    add("cp_lse", {d.B, d.Hq, d.T}, DType::F32);
  }
  bool any_dense = false, any_moe = false;
  for (int64_t i = 0; i < d.L; ++i) (d.moe_layer(i) ? any_moe : any_dense) = true;
  if (any_dense) {
    add("d1", {N, d.F}, A);
    add("d2", {N, d.F}, A);
    add("dact", {N, d.F}, A);
  }
  if (any_moe) {
    const int64_t NK = N * d.K, R = d.expert_rows();
    add("drlogits", {N, d.E}, A);
    add("dtopk_w", {N, d.K}, DType::F32);
    add("dxp", {NK, C}, A);
    if (d.ep <= 1) add("dxp2", {NK, C}, A);
    add("dyp", {NK, C}, A);
    add("de1", {R, d.Fm}, A);
    add("de2", {R, d.Fm}, A);
    add("deact", {R, d.Fm}, A);
    if (d.ep > 1) {
      add("dye", {R, C}, A);
      add("dxe", {R, C}, A);
      add("dxe2", {R, C}, A);
    }
  }
  return s;
}

Activations bind_activations(const ModelDims& d, const std::vector<TensorSpec>& specs,
                             const std::vector<Tensor>& tensors) {
  auto m = by_name(specs, tensors);
  auto get = [&](const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? Tensor{} : it->second;
  };
  Activations a;
  a.ids = get("ids");
  a.targets = get("targets");
  a.pos_ids = get("pos_ids");
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerActs l;
    l.x_in = get(p + "x_in");
    l.h1 = get(p + "h1");
    l.mean1 = get(p + "mean1");
    l.rstd1 = get(p + "rstd1");
    l.q = get(p + "q");
    l.k = get(p + "k");
    l.v = get(p + "v");
    l.o = get(p + "o");
    l.lse = get(p + "lse");
    l.x_mid = get(p + "x_mid");
    l.h2 = get(p + "h2");
    l.mean2 = get(p + "mean2");
    l.rstd2 = get(p + "rstd2");
    l.a1 = get(p + "a1");
    l.a2 = get(p + "a2");
    l.act = get(p + "act");
    l.rlogits = get(p + "rlogits");
    l.probs = get(p + "probs");
    l.topk_idx = get(p + "topk_idx");
    l.topk_w = get(p + "topk_w");
    l.row_map = get(p + "row_map");
    l.offsets = get(p + "offsets");
    l.aux = get(p + "aux");
    l.xp = get(p + "xp");
    l.e1 = get(p + "e1");
    l.e2 = get(p + "e2");
    l.eact = get(p + "eact");
    l.yp = get(p + "yp");
    l.xe = get(p + "xe");
    l.ye = get(p + "ye");
    if (l.xe.empty()) l.xe = l.xp;
    if (l.ye.empty()) l.ye = l.yp;
    l.ep_gather = get(p + "ep_gather");
    l.ep_offsets = get(p + "ep_offsets");
    WeightGradInputs& st = l.stash;
    st.attn_dy = get(p + "stash.attn_dy");
    st.dq = get(p + "stash.dq");
    st.dk = get(p + "stash.dk");
    st.dv = get(p + "stash.dv");
    st.mlp_dy = get(p + "stash.mlp_dy");
    st.d1 = get(p + "stash.d1");
    st.d2 = get(p + "stash.d2");
    st.dyp = get(p + "stash.dyp");
    st.de1 = get(p + "stash.de1");
    st.de2 = get(p + "stash.de2");
    st.drlogits = get(p + "stash.drlogits");
    a.layers.push_back(l);
  }
  a.x_final = get("x_final");
  a.hf = get("hf");
  a.meanf = get("meanf");
  a.rstdf = get("rstdf");
  a.logits = get("logits");
  a.losses = get("losses");
  a.moe_out = get("moe_out");
  return a;
}

GradScratch bind_grad_scratch(const std::vector<TensorSpec>& specs,
                              const std::vector<Tensor>& tensors) {
  auto m = by_name(specs, tensors);
  auto get = [&](const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? Tensor{} : it->second;
  };
  GradScratch g;
  g.dres = get("dres");
  g.dh = get("dh");
  g.tp_full = get("tp_full");
  g.ce_stats = get("ce_stats");
  g.dq = get("dq");
  g.dk = get("dk");
  g.dv = get("dv");
  g.dout = get("dout");
  g.d1 = get("d1");
  g.d2 = get("d2");
  g.dact = get("dact");
  g.drlogits = get("drlogits");
  g.dtopk_w = get("dtopk_w");
  g.dxp = get("dxp");
  g.dxp2 = get("dxp2");
  g.dyp = get("dyp");
  g.de1 = get("de1");
  g.de2 = get("de2");
  g.deact = get("deact");
  g.cp_positions = get("cp_positions");
  g.cp_k0 = get("cp_k0");
  g.cp_k1 = get("cp_k1");
  g.cp_v0 = get("cp_v0");
  g.cp_v1 = get("cp_v1");
  g.cp_dk0 = get("cp_dk0");
  g.cp_dk1 = get("cp_dk1");
  g.cp_dv0 = get("cp_dv0");
  g.cp_dv1 = get("cp_dv1");
  g.cp_o = get("cp_o");
  g.cp_lse = get("cp_lse");
  g.dye = get("dye");
  g.dxe = get("dxe");
  g.dxe2 = get("dxe2");
  if (g.dye.empty()) g.dye = g.dyp;
  if (g.dxe.empty()) g.dxe = g.dxp;
  if (g.dxe2.empty()) g.dxe2 = g.dxp2;
  return g;
}

}  // namespace trainer
