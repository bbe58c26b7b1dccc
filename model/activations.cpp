#include "model/activations.h"

#include "model/recompute.h"

#include <set>
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

namespace {
// Everything layer i saves for its backward, by field name (without the
// "layers.i." prefix); recompute decides where each one lives.
std::vector<TensorSpec> layer_specs(const ModelDims& d, int64_t i) {
  // R: this rank's token rows of the residual stream (N / tp under sequence
  // parallelism), where norms and residual adds run; the norm outputs are
  // kept at R rows too (gathered when a column-parallel linear reads them:
  // model/tensor_parallel.h). Activations use the storage type; statistics
  // read back or reduced across tokens stay F32; indices are I32.
  const int64_t N = d.N(), R = d.rows(), C = d.C, FF = d.F;
  std::vector<TensorSpec> s;
  const DType A = d.act, F = DType::F32;
  auto add = [&](std::string n, Shape sh, DType t) { s.push_back({std::move(n), std::move(sh), t}); };
  add("x_in", {R, C}, A);
  add("h1", {R, C}, A);
  if (!d.llama) add("mean1", {R}, F);
  add("rstd1", {R}, F);
  add("q", {d.B, d.T, d.Hq, d.D}, A);
  add("k", {d.B, d.T, d.Hkv, d.D}, A);
  add("v", {d.B, d.T, d.Hkv, d.D}, A);
  add("o", {N, d.Hq * d.D}, A);
  add("lse", {d.B, d.Hq, d.T}, F);
  add("x_mid", {R, C}, A);
  add("h2", {R, C}, A);
  if (!d.llama) add("mean2", {R}, F);
  add("rstd2", {R}, F);
  if (d.moe_layer(i)) {
    const int64_t NK = N * d.K;
    add("rlogits", {N, d.E}, A);
    add("probs", {N, d.E}, F);
    add("topk_idx", {N, d.K}, DType::I32);
    add("topk_w", {N, d.K}, F);
    add("router_stats", {2, d.E}, F);
    add("row_map", {N, d.K}, DType::I32);
    add("offsets", {d.E + 1}, DType::I32);
    add("aux", {1}, F);
    const int64_t R = d.expert_rows();
    add("xp", {NK, C}, A);
    add("e1", {R, d.Fm}, A);
    if (d.llama) add("e2", {R, d.Fm}, A);
    add("eact", {R, d.Fm}, A);
    add("yp", {NK, C}, A);
    if (d.ep > 1) {
      add("xe", {R, C}, A);
      add("ye", {R, C}, A);
      add("ep_gather", {int64_t(d.ep), d.E + 1}, DType::I32);
      add("ep_offsets", {int64_t(d.ep), d.experts_here() + 1}, DType::I32);
    }
  } else {
    add("a1", {N, FF}, A);
    if (d.llama) add("a2", {N, FF}, A);
    add("act", {N, FF}, A);
  }
  if (d.split_backward) {
    // Whole-sequence gradients: the weight gradients sum over every token.
    add("stash.attn_dy", {N, C}, A);
    add("stash.dq", {d.B, d.T, d.Hq, d.D}, A);
    add("stash.dk", {d.B, d.T, d.Hkv, d.D}, A);
    add("stash.dv", {d.B, d.T, d.Hkv, d.D}, A);
    if (d.moe_layer(i)) {
      const int64_t R = d.expert_rows();
      add("stash.dyp", {R, C}, A);
      add("stash.de1", {R, d.Fm}, A);
      if (d.llama) add("stash.de2", {R, d.Fm}, A);
      add("stash.drlogits", {N, d.E}, A);
    } else {
      add("stash.mlp_dy", {N, C}, A);
      add("stash.d1", {N, FF}, A);
      if (d.llama) add("stash.d2", {N, FF}, A);
    }
  }
  return s;
}

// The LayerActs tensors by field name, for binding.
struct Field {
  const char* name;
  Tensor LayerActs::*member;
};
const std::vector<Field>& layer_fields() {
  static const std::vector<Field> f = {
      {"x_in", &LayerActs::x_in},       {"h1", &LayerActs::h1},
      {"mean1", &LayerActs::mean1},     {"rstd1", &LayerActs::rstd1},
      {"q", &LayerActs::q},             {"k", &LayerActs::k},
      {"v", &LayerActs::v},             {"o", &LayerActs::o},
      {"lse", &LayerActs::lse},         {"x_mid", &LayerActs::x_mid},
      {"h2", &LayerActs::h2},           {"mean2", &LayerActs::mean2},
      {"rstd2", &LayerActs::rstd2},     {"a1", &LayerActs::a1},
      {"a2", &LayerActs::a2},           {"act", &LayerActs::act},
      {"rlogits", &LayerActs::rlogits}, {"probs", &LayerActs::probs},
      {"topk_idx", &LayerActs::topk_idx}, {"topk_w", &LayerActs::topk_w},
      {"router_stats", &LayerActs::router_stats}, {"row_map", &LayerActs::row_map}, {"offsets", &LayerActs::offsets},
      {"aux", &LayerActs::aux},         {"xp", &LayerActs::xp},
      {"e1", &LayerActs::e1},           {"e2", &LayerActs::e2},
      {"eact", &LayerActs::eact},       {"yp", &LayerActs::yp},
      {"xe", &LayerActs::xe},           {"ye", &LayerActs::ye},
      {"ep_gather", &LayerActs::ep_gather}, {"ep_offsets", &LayerActs::ep_offsets},
  };
  return f;
}

// A layer's tensors from `get(prefix + name)`; fields it does not keep come
// from `shared` when recompute dropped them. Without expert parallelism the
// experts' side is the dispatch buffers themselves.
template <class Get>
LayerActs bind_layer(const std::string& prefix, Recompute mode, const LayerActs& shared, const Get& get) {
  LayerActs l;
  for (const Field& f : layer_fields()) {
    l.*f.member = get(prefix + f.name);
    if ((l.*f.member).empty() && recomputed_field(mode, f.name)) l.*f.member = shared.*f.member;
  }
  if (l.xe.empty()) l.xe = l.xp;
  if (l.ye.empty()) l.ye = l.yp;
  return l;
}
}  // namespace

std::vector<TensorSpec> activation_specs(const ModelDims& d) {
  const int64_t N = d.N(), R = d.rows(), C = d.C;
  std::vector<TensorSpec> s;
  const DType A = d.act, F = DType::F32;
  auto add = [&](std::string n, Shape sh, DType t) { s.push_back({std::move(n), std::move(sh), t}); };
  add("ids", {N}, DType::I32);
  add("targets", {N}, DType::I32);
  if (!d.llama) add("pos_ids", {N}, DType::I32);
  if (d.documents) add("doc_start", {N}, DType::I32);
  if (d.documents && d.llama) add("tok_pos", {N}, DType::I32);
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const Recompute mode = d.recompute_of(i);
    for (const TensorSpec& t : layer_specs(d, i))
      if (!recomputed_field(mode, t.name)) add(p + t.name, t.shape, t.dtype);
  }
  add("x_final", {R, C}, A);
  add("hf", {R, C}, A);
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
  // Sequence parallelism: two whole-sequence [N, C] buffers (model/tensor_parallel.h).
  if (d.sp) {
    add("tp_full", {N, C}, A);
    add("tp_gathered", {N, C}, A);
  }
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
  if (any_moe && d.cp > 1 && d.capacity > 0) {
    const int64_t all = int64_t(d.cp) * N;
    add("cp_moe_all_rows", {all, d.K}, DType::I32);
    add("cp_moe_all_idx", {all, d.K}, DType::I32);
    add("cp_moe_all_offsets", {d.E + 1}, DType::I32);
    add("cp_moe_admitted", {N, d.K}, DType::I32);
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
  // One copy of what recomputing layers dropped, shared by all of them and
  // every slot (model/recompute.h); each name has one shape in every layer.
  std::set<std::string> shared;
  for (int64_t i = 0; i < d.L; ++i)
    for (const TensorSpec& t : layer_specs(d, i))
      if (recomputed_field(d.recompute_of(i), t.name) && shared.insert(t.name).second)
        add("recompute." + t.name, t.shape, t.dtype);
  return s;
}

Activations bind_activations(const ModelDims& d, const std::vector<TensorSpec>& specs,
                             const std::vector<Tensor>& tensors, const LayerActs& shared) {
  auto m = by_name(specs, tensors);
  auto get = [&](const std::string& n) {
    auto it = m.find(n);
    return it == m.end() ? Tensor{} : it->second;
  };
  Activations a;
  a.ids = get("ids");
  a.targets = get("targets");
  a.pos_ids = get("pos_ids");
  a.doc_start = get("doc_start");
  a.tok_pos = get("tok_pos");
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerActs l = bind_layer(p, d.recompute_of(i), shared, get);
    l.doc_start = a.doc_start;
    l.tok_pos = d.llama ? a.tok_pos : a.pos_ids;
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
  g.tp_gathered = get("tp_gathered");
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
  g.cp_moe_all_rows = get("cp_moe_all_rows");
  g.cp_moe_all_idx = get("cp_moe_all_idx");
  g.cp_moe_all_offsets = get("cp_moe_all_offsets");
  g.cp_moe_admitted = get("cp_moe_admitted");
  g.dye = get("dye");
  g.dxe = get("dxe");
  g.dxe2 = get("dxe2");
  g.recompute = bind_layer("recompute.", Recompute::None, LayerActs{}, get);
  if (g.dye.empty()) g.dye = g.dyp;
  if (g.dxe.empty()) g.dxe = g.dxp;
  if (g.dxe2.empty()) g.dxe2 = g.dxp2;
  return g;
}

}  // namespace trainer
