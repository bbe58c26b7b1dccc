#include "model/params.h"

#include "core/fnv1a.h"
#include "core/simd_clones.h"
#include "model/normal_pair.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

namespace trainer {

bool ParamInfo::expert() const {
  return std::find(cuts.begin(), cuts.end(), Cut::EP) != cuts.end();
}

bool ParamInfo::tp_split() const {
  return std::find(cuts.begin(), cuts.end(), Cut::TP) != cuts.end();
}

int64_t ParamInfo::box_numel() const {
  int64_t n = 1;
  for (int64_t d : box_shape) n *= d;
  return n;
}

std::vector<ParamInfo> parameter_list(const ModelDims& d, double init_std) {
  std::vector<ParamInfo> out;
  const float std0 = float(init_std);
  // GPT-2's scaled init of the projections that write into the residual
  // stream keeps its variance from growing with depth (the whole model's).
  const float std_out = float(init_std / std::sqrt(2.0 * double(d.layers_total())));
  constexpr Cut N = Cut::None, TP = Cut::TP, EP = Cut::EP;
  auto add = [&](std::string name, std::vector<int64_t> shape, std::vector<Cut> cuts, Init init, float sd,
                 bool decay) {
    ParamInfo p;
    p.spec = {std::move(name), shape, d.act};
    p.cuts = std::move(cuts);
    p.global_shape = shape;
    p.box_shape = shape;
    p.offset.assign(shape.size(), 0);
    p.init = init;
    p.init_std = sd;
    p.decay = decay;
    out.push_back(std::move(p));
  };
  auto mat = [&](std::string name, std::vector<int64_t> shape, std::vector<Cut> cuts, float sd) {
    add(std::move(name), std::move(shape), std::move(cuts), Init::Normal, sd, true);
  };
  auto vec = [&](std::string name, int64_t n, Cut cut, Init init) { add(std::move(name), {n}, {cut}, init, 0.f, false); };
  auto norm = [&](const std::string& prefix) {
    vec(prefix + ".weight", d.C, N, Init::Ones);
    if (!d.llama) vec(prefix + ".bias", d.C, N, Init::Zeros);
  };
  const int64_t q_dim = d.Hq * d.D, kv_dim = d.Hkv * d.D;

  if (d.has_embedding) {
    mat("tok_embed.weight", {d.V, d.C}, {TP, N}, std0);
    if (!d.llama) mat("pos_embed.weight", {d.max_seq, d.C}, {N, N}, std0);
  }
  for (int64_t i = 0; i < d.L; ++i) {
    const std::string p = "layers." + std::to_string(d.first_layer + i) + ".";
    norm(p + "attn_norm");
    for (auto [nm, rows] : {std::pair{"wq", q_dim}, {"wk", kv_dim}, {"wv", kv_dim}}) {
      mat(p + "attn." + nm + ".weight", {rows, d.C}, {TP, N}, std0);
      if (d.qkv_bias) vec(p + "attn." + nm + ".bias", rows, TP, Init::Zeros);
    }
    mat(p + "attn.wo.weight", {d.C, q_dim}, {N, TP}, std_out);
    if (d.o_bias) vec(p + "attn.wo.bias", d.C, N, Init::Zeros);
    norm(p + "mlp_norm");
    if (d.moe_layer(i)) {
      mat(p + "moe.router.weight", {d.E, d.C}, {N, N}, std0);
      if (d.llama) {
        mat(p + "moe.w_gate", {d.experts_here(), d.Fm, d.C}, {EP, TP, N}, std0);
        mat(p + "moe.w_up", {d.experts_here(), d.Fm, d.C}, {EP, TP, N}, std0);
        mat(p + "moe.w_down", {d.experts_here(), d.C, d.Fm}, {EP, N, TP}, std_out);
      } else {
        mat(p + "moe.w_fc", {d.experts_here(), d.Fm, d.C}, {EP, TP, N}, std0);
        mat(p + "moe.w_proj", {d.experts_here(), d.C, d.Fm}, {EP, N, TP}, std_out);
      }
    } else if (d.llama) {
      mat(p + "mlp.w_gate.weight", {d.F, d.C}, {TP, N}, std0);
      mat(p + "mlp.w_up.weight", {d.F, d.C}, {TP, N}, std0);
      mat(p + "mlp.w_down.weight", {d.C, d.F}, {N, TP}, std_out);
    } else {
      mat(p + "mlp.w_fc.weight", {d.F, d.C}, {TP, N}, std0);
      vec(p + "mlp.w_fc.bias", d.F, TP, Init::Zeros);
      mat(p + "mlp.w_proj.weight", {d.C, d.F}, {N, TP}, std_out);
      vec(p + "mlp.w_proj.bias", d.C, N, Init::Zeros);
    }
  }
  if (d.has_head) {
    norm("final_norm");
    if (!d.tied)
      mat("lm_head.weight", {d.V, d.C}, {TP, N}, std0);
    else if (!d.has_embedding)  // the last pipeline stage keeps its own copy of the tied table
      mat("tok_embed.weight", {d.V, d.C}, {TP, N}, std0);
  }
  return out;
}

void for_each_global_run(const ParamInfo& p, int64_t begin, int64_t count,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const auto& shape = p.spec.shape;
  const size_t nd = shape.size();
  if (p.global_shape.size() != nd || p.offset.size() != nd || p.box_shape.size() != nd)
    throw std::logic_error("for_each_global_run: '" + p.spec.name + "' has no global placement");
  const int64_t end = std::min(begin + count, p.box_numel());
  if (nd == 0 || begin >= end) return;
  const int64_t row = shape[nd - 1];
  std::vector<int64_t> idx(nd, 0);
  for (int64_t r = begin / row; r * row < end; ++r) {
    int64_t rest = r;
    for (size_t k = nd - 1; k-- > 0;) {
      idx[k] = rest % shape[k];
      rest /= shape[k];
    }
    int64_t g = 0;
    for (size_t k = 0; k < nd; ++k) g = g * p.global_shape[k] + p.offset[k] + (k + 1 < nd ? idx[k] : 0);
    const int64_t lo = std::max(begin, r * row), hi = std::min(end, (r + 1) * row);
    fn(lo, g + (lo - r * row), hi - lo);
  }
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
    const std::string p = "layers." + std::to_string(d.first_layer + i) + ".";
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
uint64_t hash_name(const std::string& s) { return fnv1a(s); }
}  // namespace

namespace {
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

// Draw k of the stream that starts at s0: SplitMix64 is a counter-based
// generator, so any draw is computed directly.
uint64_t draw(uint64_t s0, uint64_t k) {
  uint64_t z = s0 + (k + 1) * kGamma;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Pairs j0 .. j0 + n - 1 (n <= kPairs): pair j is elements 2j (a, the cos
// side) and 2j+1 (b, the sin side) of the global tensor, Box-Muller on
// 53-bit uniforms from draws 2j and 2j+1. In batches, so that the angle's
// polynomial runs on SIMD lanes (core/simd_clones.h); the draws and libm's
// log stay scalar. The same operations per pair as one at a time.
constexpr int64_t kPairs = 64;

TRAINER_SIMD_CLONES void normal_pairs(uint64_t s0, uint64_t j0, int64_t n, double* a, double* b) {
  double u1[kPairs], u2[kPairs], r[kPairs];
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t j = j0 + uint64_t(i);
    u1[i] = (double(draw(s0, 2 * j) >> 11) + 1.0) * 0x1.0p-53;
    u2[i] = double(draw(s0, 2 * j + 1) >> 11) * 0x1.0p-53;
  }
  for (int64_t i = 0; i < n; ++i) r[i] = std::sqrt(-2.0 * std::log(u1[i]));
  for (int64_t i = 0; i < n; ++i) {
    normal_math::sincos_turns(u2[i], b[i], a[i]);
    a[i] *= r[i];
    b[i] *= r[i];
  }
}
}  // namespace

void initial_values(const ParamInfo& p, uint64_t seed, int64_t begin, int64_t count, float* out) {
  if (count <= 0) return;
  // Padding rows (past the box along dimension 0) start and stay zero.
  const int64_t inside = p.box_shape.size() == p.spec.shape.size() ? p.box_numel() : p.spec.numel();
  if (begin + count > inside) {
    const int64_t from = std::max(begin, inside);
    std::fill(out + (from - begin), out + count, 0.f);
    count = from - begin;
    if (count <= 0) return;
  }
  if (p.init != Init::Normal) {
    std::fill(out, out + count, p.init == Init::Ones ? 1.f : 0.f);
    return;
  }
  const auto& shape = p.spec.shape;
  const size_t nd = shape.size();
  if (p.global_shape.size() != nd || p.offset.size() != nd)
    throw std::logic_error("initial_values: '" + p.spec.name + "' has no global placement");
  if (nd > size_t(kMaxDims)) throw std::logic_error("initial_values: '" + p.spec.name + "' has more than 4 dims");
  const uint64_t s0 = seed ^ hash_name(p.spec.name);
  const int64_t row = nd ? shape[nd - 1] : 1;  // contiguous run in both the slice and the global tensor
  const int64_t first_row = begin / row, last_row = (begin + count - 1) / row;
#pragma omp parallel for schedule(static) if (count > (1 << 16))
  for (int64_t r = first_row; r <= last_row; ++r) {
    // Global flat index of this row's first element.
    int64_t g = 0, rest = r;
    int64_t idx[kMaxDims] = {};
    for (size_t k = nd - 1; k-- > 0;) {
      idx[k] = rest % shape[k];
      rest /= shape[k];
    }
    for (size_t k = 0; k < nd; ++k) g = g * p.global_shape[k] + p.offset[k] + (k + 1 < nd ? idx[k] : 0);
    const int64_t lo = std::max(begin, r * row), hi = std::min(begin + count, (r + 1) * row);
    // Global elements [g_lo, g_hi) of this row, pairs [p_lo, p_hi).
    const int64_t g_lo = g + (lo - r * row), g_hi = g + (hi - r * row);
    double a[kPairs], b[kPairs];
    for (int64_t p0 = g_lo >> 1; p0 <= (g_hi - 1) >> 1; p0 += kPairs) {
      const int64_t n = std::min(kPairs, ((g_hi - 1) >> 1) + 1 - p0);
      normal_pairs(s0, uint64_t(p0), n, a, b);
      const int64_t e0 = std::max(g_lo, 2 * p0), e1 = std::min(g_hi, 2 * (p0 + n));
      for (int64_t e = e0; e < e1; ++e) {
        const int64_t k = (e >> 1) - p0;
        out[lo + (e - g_lo) - begin] = float(((e & 1) ? b[k] : a[k]) * p.init_std);
      }
    }
  }
}

std::vector<float> initial_values(const ParamInfo& p, uint64_t seed) {
  std::vector<float> x(size_t(p.spec.numel()));
  initial_values(p, seed, 0, int64_t(x.size()), x.data());
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
