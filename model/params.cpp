#include "model/params.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

namespace trainer {

const char* split_name(Split s) {
  switch (s) {
    case Split::Replicated: return "replicated";
    case Split::Column: return "column";
    case Split::Row: return "row";
    case Split::Vocab: return "vocab";
    case Split::Expert: return "expert";
  }
  return "?";
}

std::vector<ParamInfo> parameter_list(const ModelDims& d, double init_std) {
  std::vector<ParamInfo> out;
  const float std0 = float(init_std);
  // GPT-2's scaled init of the projections that write into the residual
  // stream keeps its variance from growing with depth.
  const float std_out = float(init_std / std::sqrt(2.0 * double(d.L)));
  auto mat = [&](std::string name, std::vector<int64_t> shape, Split split, float sd) {
    out.push_back({{std::move(name), std::move(shape), d.act}, split, Init::Normal, sd, true});
  };
  auto vec = [&](std::string name, int64_t n, Split split, Init init) {
    out.push_back({{std::move(name), {n}, d.act}, split, init, 0.f, false});
  };
  auto norm = [&](const std::string& prefix) {
    vec(prefix + ".weight", d.C, Split::Replicated, Init::Ones);
    if (!d.llama) vec(prefix + ".bias", d.C, Split::Replicated, Init::Zeros);
  };
  const int64_t q_dim = d.Hq * d.D, kv_dim = d.Hkv * d.D;

  mat("tok_embed.weight", {d.V, d.C}, Split::Vocab, std0);
  if (!d.llama) mat("pos_embed.weight", {d.max_seq, d.C}, Split::Replicated, std0);
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    norm(p + "attn_norm");
    for (auto [nm, rows] : {std::pair{"wq", q_dim}, {"wk", kv_dim}, {"wv", kv_dim}}) {
      mat(p + "attn." + nm + ".weight", {rows, d.C}, Split::Column, std0);
      if (!d.llama) vec(p + "attn." + nm + ".bias", rows, Split::Column, Init::Zeros);
    }
    mat(p + "attn.wo.weight", {d.C, q_dim}, Split::Row, std_out);
    if (!d.llama) vec(p + "attn.wo.bias", d.C, Split::Replicated, Init::Zeros);
    norm(p + "mlp_norm");
    if (d.moe_layer(i)) {
      mat(p + "moe.router.weight", {d.E, d.C}, Split::Replicated, std0);
      if (d.llama) {
        mat(p + "moe.w_gate", {d.E, d.Fm, d.C}, Split::Expert, std0);
        mat(p + "moe.w_up", {d.E, d.Fm, d.C}, Split::Expert, std0);
        mat(p + "moe.w_down", {d.E, d.C, d.Fm}, Split::Expert, std_out);
      } else {
        mat(p + "moe.w_fc", {d.E, d.Fm, d.C}, Split::Expert, std0);
        mat(p + "moe.w_proj", {d.E, d.C, d.Fm}, Split::Expert, std_out);
      }
    } else if (d.llama) {
      mat(p + "mlp.w_gate.weight", {d.F, d.C}, Split::Column, std0);
      mat(p + "mlp.w_up.weight", {d.F, d.C}, Split::Column, std0);
      mat(p + "mlp.w_down.weight", {d.C, d.F}, Split::Row, std_out);
    } else {
      mat(p + "mlp.w_fc.weight", {d.F, d.C}, Split::Column, std0);
      vec(p + "mlp.w_fc.bias", d.F, Split::Column, Init::Zeros);
      mat(p + "mlp.w_proj.weight", {d.C, d.F}, Split::Row, std_out);
      vec(p + "mlp.w_proj.bias", d.C, Split::Replicated, Init::Zeros);
    }
  }
  norm("final_norm");
  if (!d.tied) mat("lm_head.weight", {d.V, d.C}, Split::Vocab, std0);
  return out;
}

std::vector<TensorSpec> specs_of(const std::vector<ParamInfo>& params) {
  std::vector<TensorSpec> s;
  s.reserve(params.size());
  for (const auto& p : params) s.push_back(p.spec);
  return s;
}

int64_t parameter_count(const std::vector<ParamInfo>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.spec.numel();
  return n;
}

namespace {
// Every named slot of Weights, in one table shared by bind_weights and
// weight_slots so that the two can never disagree on a name.
std::vector<std::pair<std::string, Tensor*>> slot_table(const ModelDims& d, Weights& w) {
  std::vector<std::pair<std::string, Tensor*>> t;
  t.emplace_back("tok_embed.weight", &w.tok_embed);
  t.emplace_back("pos_embed.weight", &w.pos_embed);
  w.layers.resize(size_t(d.L));
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[size_t(i)];
    for (auto [name, slot] : std::initializer_list<std::pair<const char*, Tensor*>>{
             {"attn_norm.weight", &l.attn_norm_w}, {"attn_norm.bias", &l.attn_norm_b},
             {"attn.wq.weight", &l.wq},            {"attn.wq.bias", &l.bq},
             {"attn.wk.weight", &l.wk},            {"attn.wk.bias", &l.bk},
             {"attn.wv.weight", &l.wv},            {"attn.wv.bias", &l.bv},
             {"attn.wo.weight", &l.wo},            {"attn.wo.bias", &l.bo},
             {"mlp_norm.weight", &l.mlp_norm_w},   {"mlp_norm.bias", &l.mlp_norm_b},
             {"mlp.w_gate.weight", &l.w_gate},     {"mlp.w_up.weight", &l.w_up},
             {"mlp.w_down.weight", &l.w_down},     {"mlp.w_fc.weight", &l.w_fc},
             {"mlp.w_fc.bias", &l.b_fc},           {"mlp.w_proj.weight", &l.w_proj},
             {"mlp.w_proj.bias", &l.b_proj},       {"moe.router.weight", &l.router},
             {"moe.w_gate", &l.e_gate},            {"moe.w_up", &l.e_up},
             {"moe.w_down", &l.e_down},            {"moe.w_fc", &l.e_fc},
             {"moe.w_proj", &l.e_proj}})
      t.emplace_back(p + name, slot);
  }
  t.emplace_back("final_norm.weight", &w.final_norm_w);
  t.emplace_back("final_norm.bias", &w.final_norm_b);
  t.emplace_back("lm_head.weight", &w.lm_head);
  return t;
}
}  // namespace

std::vector<std::vector<Tensor*>> weight_slots(const ModelDims& d, const std::vector<ParamInfo>& params,
                                               Weights& w) {
  std::unordered_map<std::string, Tensor*> by_name;
  for (auto& [name, slot] : slot_table(d, w)) by_name[name] = slot;
  std::vector<std::vector<Tensor*>> out(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = by_name.find(params[i].spec.name);
    if (it == by_name.end()) throw std::logic_error("weight_slots: no slot for '" + params[i].spec.name + "'");
    out[i].push_back(it->second);
    if (d.tied && params[i].spec.name == "tok_embed.weight") out[i].push_back(&w.lm_head);
  }
  return out;
}

Weights bind_weights(const ModelDims& d, const std::vector<ParamInfo>& params,
                     const std::vector<Tensor>& tensors) {
  if (params.size() != tensors.size()) throw std::logic_error("bind_weights: count mismatch");
  Weights w;
  const auto slots = weight_slots(d, params, w);
  for (size_t i = 0; i < params.size(); ++i)
    for (Tensor* s : slots[i]) *s = tensors[i];
  return w;
}

namespace {
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across platforms and runs
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

std::vector<float> initial_values(const ParamInfo& p, uint64_t seed) {
  std::vector<float> x(size_t(p.spec.numel()));
  if (p.init != Init::Normal) {
    std::fill(x.begin(), x.end(), p.init == Init::Ones ? 1.f : 0.f);
    return x;
  }
  uint64_t state = seed ^ hash_name(p.spec.name);
  const size_t n = x.size();
  // Box-Muller on 53-bit uniforms; two normals per pair of draws.
  for (size_t j = 0; j < n; j += 2) {
    double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
    double u2 = double(splitmix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    x[j] = float(r * std::cos(2 * M_PI * u2) * p.init_std);
    if (j + 1 < n) x[j + 1] = float(r * std::sin(2 * M_PI * u2) * p.init_std);
  }
  return x;
}

void init_parameters(const std::vector<ParamInfo>& params, const std::vector<Tensor>& tensors,
                     uint64_t seed) {
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> x = initial_values(params[i], seed);
    std::copy(x.begin(), x.end(), tensors[i].f32());
  }
}

}  // namespace trainer
