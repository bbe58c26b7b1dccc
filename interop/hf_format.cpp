#include "interop/hf_format.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "model/dims.h"
#include "model/params.h"

namespace trainer {

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string hf_architecture(const Config& c) {
  const bool moe = c.model.moe.num_experts > 0;
  if (c.model.arch == "gpt2") {
    if (moe) throw ConfigError("model.arch=gpt2 with model.moe: Hugging Face has no GPT-2-style MoE architecture to export to");
    if (c.model.sliding_window > 0)
      throw ConfigError("model.arch=gpt2 with model.sliding_window=" + std::to_string(c.model.sliding_window) +
                        ": GPT2LMHeadModel has no sliding-window attention");
    if (c.kv_heads() != c.model.n_heads)
      throw ConfigError("model.arch=gpt2 with model.n_kv_heads=" + std::to_string(c.kv_heads()) +
                        " != model.n_heads: GPT2LMHeadModel has no grouped-query attention");
    return "GPT2LMHeadModel";
  }
  const std::string& bias = c.model.attn_bias;
  if (c.model.sliding_window > 0 && bias != "none")
    throw ConfigError("model.attn_bias=" + bias + " with model.sliding_window=" +
                      std::to_string(c.model.sliding_window) +
                      ": MistralForCausalLM has no attention biases (and Qwen2's windows are not supported)");
  // Mistral is Llama's tensors and math plus the sliding window.
  if (!moe)
    return bias == "qkv" ? "Qwen2ForCausalLM" : c.model.sliding_window > 0 ? "MistralForCausalLM" : "LlamaForCausalLM";
  if (bias != "none")
    throw ConfigError("model.attn_bias=" + bias + " with model.moe: MixtralForCausalLM has no attention biases");
  if (c.model.moe.every != 1)
    throw ConfigError("model.moe.every=" + std::to_string(c.model.moe.every) +
                      ": MixtralForCausalLM has experts in every layer; only moe.every=1 exports");
  if (!c.model.moe.normalize_topk)
    throw ConfigError("model.moe.normalize_topk=false: MixtralForCausalLM renormalises the top-k weights");
  return "MixtralForCausalLM";
}

std::string hf_model_type(const std::string& arch) {
  if (arch == "GPT2LMHeadModel") return "gpt2";
  if (arch == "MixtralForCausalLM") return "mixtral";
  if (arch == "Qwen2ForCausalLM") return "qwen2";
  if (arch == "MistralForCausalLM") return "mistral";
  return "llama";
}

json::Value hf_rope_scaling(const RopeScalingConfig& s) {
  if (s.type == "none") return nullptr;
  json::Value r;
  if (s.type == "linear") {
    // "type", the spelling transformers before 4.43 require (with exactly
    // these two fields); later ones read it too.
    r["type"] = "linear";
    r["factor"] = s.factor;
    return r;
  }
  r["rope_type"] = s.type;
  r["factor"] = s.factor;
  r["low_freq_factor"] = s.low_freq_factor;
  r["high_freq_factor"] = s.high_freq_factor;
  r["original_max_position_embeddings"] = s.original_max_seq_len;
  return r;
}

namespace {

// ---- sliding-window attention: what export writes ---------------------------
// model.sliding_window: a query sees itself and the W keys before it, as
// Mistral's and Mixtral's `sliding_window` (null: full attention). Qwen2's
// window (use_sliding_window, per layer) is not supported: written off.
void write_hf_sliding_window(const Config& c, const std::string& arch, json::Value& j) {
  const int64_t w = c.model.sliding_window;
  if (arch == "MistralForCausalLM") j["sliding_window"] = w;
  if (arch == "MixtralForCausalLM") {
    if (w > 0)
      j["sliding_window"] = w;
    else
      j["sliding_window"] = nullptr;
  }
  if (arch == "Qwen2ForCausalLM") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.model.n_layers;
  }
}
// ---- end of sliding-window attention ----------------------------------------

}  // namespace

json::Value hf_config(const Config& c, const std::string& torch_dtype) {
  const std::string arch = hf_architecture(c);
  const ModelConfig& m = c.model;
  json::Value j;
  j["architectures"] = json::Value::array({arch});
  if (arch == "GPT2LMHeadModel") {
    j["model_type"] = "gpt2";
    j["vocab_size"] = m.vocab_size;
    j["n_embd"] = m.d_model;
    j["n_layer"] = m.n_layers;
    j["n_head"] = m.n_heads;
    j["n_inner"] = c.d_ff();
    j["n_positions"] = m.max_seq_len;
    j["n_ctx"] = m.max_seq_len;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = m.norm_eps;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
  } else {
    j["model_type"] = hf_model_type(arch);
    j["vocab_size"] = m.vocab_size;
    j["hidden_size"] = m.d_model;
    j["intermediate_size"] = arch == "MixtralForCausalLM" ? c.moe_d_ff() : c.d_ff();
    j["num_hidden_layers"] = m.n_layers;
    j["num_attention_heads"] = m.n_heads;
    j["num_key_value_heads"] = c.kv_heads();
    j["max_position_embeddings"] = m.max_seq_len;
    j["rms_norm_eps"] = m.norm_eps;
    j["rope_theta"] = m.rope_theta;
    j["rope_scaling"] = hf_rope_scaling(m.rope_scaling);
    j["hidden_act"] = "silu";
    j["attention_dropout"] = 0.0;
    if (arch == "LlamaForCausalLM") {
      j["attention_bias"] = m.attn_bias == "qkvo";
      j["mlp_bias"] = false;
    }
    if (arch == "MixtralForCausalLM") {
      j["num_local_experts"] = m.moe.num_experts;
      j["num_experts_per_tok"] = m.moe.top_k;
      j["router_aux_loss_coef"] = m.moe.aux_loss_coeff;
      j["output_router_logits"] = false;
    }
    write_hf_sliding_window(c, arch, j);
  }
  j["tie_word_embeddings"] = m.tied();
  j["initializer_range"] = m.init_std;
  j["torch_dtype"] = torch_dtype;
  j["use_cache"] = true;
  return j;
}

namespace {

// One Hugging Face tensor (or group of them) and where it comes from.
struct Rule {
  enum Kind { Same, Transposed, FusedQkvTransposed, FusedQkvBias, Experts } kind;
  std::vector<std::string> ours;  // FusedQkv*: q, k, v
  std::string hf;                 // Experts: "...experts.{e}.w1.weight"
};

std::vector<Rule> rules(const Config& c) {
  const std::string arch = hf_architecture(c);
  const ModelDims d = make_dims(c, 1, 1);
  std::vector<Rule> r;
  const bool tied = c.model.tied();
  if (arch == "GPT2LMHeadModel") {
    r.push_back({Rule::Same, {"tok_embed.weight"}, "transformer.wte.weight"});
    r.push_back({Rule::Same, {"pos_embed.weight"}, "transformer.wpe.weight"});
    for (int i = 0; i < c.model.n_layers; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".", h = "transformer.h." + std::to_string(i) + ".";
      r.push_back({Rule::Same, {p + "attn_norm.weight"}, h + "ln_1.weight"});
      r.push_back({Rule::Same, {p + "attn_norm.bias"}, h + "ln_1.bias"});
      r.push_back({Rule::FusedQkvTransposed, {p + "attn.wq.weight", p + "attn.wk.weight", p + "attn.wv.weight"},
                   h + "attn.c_attn.weight"});
      r.push_back({Rule::FusedQkvBias, {p + "attn.wq.bias", p + "attn.wk.bias", p + "attn.wv.bias"},
                   h + "attn.c_attn.bias"});
      r.push_back({Rule::Transposed, {p + "attn.wo.weight"}, h + "attn.c_proj.weight"});
      r.push_back({Rule::Same, {p + "attn.wo.bias"}, h + "attn.c_proj.bias"});
      r.push_back({Rule::Same, {p + "mlp_norm.weight"}, h + "ln_2.weight"});
      r.push_back({Rule::Same, {p + "mlp_norm.bias"}, h + "ln_2.bias"});
      r.push_back({Rule::Transposed, {p + "mlp.w_fc.weight"}, h + "mlp.c_fc.weight"});
      r.push_back({Rule::Same, {p + "mlp.w_fc.bias"}, h + "mlp.c_fc.bias"});
      r.push_back({Rule::Transposed, {p + "mlp.w_proj.weight"}, h + "mlp.c_proj.weight"});
      r.push_back({Rule::Same, {p + "mlp.w_proj.bias"}, h + "mlp.c_proj.bias"});
    }
    r.push_back({Rule::Same, {"final_norm.weight"}, "transformer.ln_f.weight"});
    r.push_back({Rule::Same, {"final_norm.bias"}, "transformer.ln_f.bias"});
  } else {
    r.push_back({Rule::Same, {"tok_embed.weight"}, "model.embed_tokens.weight"});
    for (int64_t i = 0; i < d.L; ++i) {
      const std::string p = "layers." + std::to_string(i) + ".", h = "model.layers." + std::to_string(i) + ".";
      r.push_back({Rule::Same, {p + "attn_norm.weight"}, h + "input_layernorm.weight"});
      for (const char* w : {"q", "k", "v", "o"}) {
        r.push_back({Rule::Same, {p + "attn.w" + w + ".weight"}, h + "self_attn." + w + "_proj.weight"});
        if (*w == 'o' ? d.o_bias : d.qkv_bias)
          r.push_back({Rule::Same, {p + "attn.w" + w + ".bias"}, h + "self_attn." + w + "_proj.bias"});
      }
      r.push_back({Rule::Same, {p + "mlp_norm.weight"}, h + "post_attention_layernorm.weight"});
      if (d.moe_layer(i)) {
        const std::string b = h + "block_sparse_moe.";
        r.push_back({Rule::Same, {p + "moe.router.weight"}, b + "gate.weight"});
        r.push_back({Rule::Experts, {p + "moe.w_gate"}, b + "experts.{e}.w1.weight"});
        r.push_back({Rule::Experts, {p + "moe.w_down"}, b + "experts.{e}.w2.weight"});
        r.push_back({Rule::Experts, {p + "moe.w_up"}, b + "experts.{e}.w3.weight"});
      } else {
        for (const auto& [w, hw] : {std::pair{"gate", "gate_proj"}, {"up", "up_proj"}, {"down", "down_proj"}})
          r.push_back({Rule::Same, {p + "mlp.w_" + w + ".weight"}, h + "mlp." + hw + ".weight"});
      }
    }
    r.push_back({Rule::Same, {"final_norm.weight"}, "model.norm.weight"});
  }
  if (!tied) r.push_back({Rule::Same, {"lm_head.weight"}, "lm_head.weight"});
  return r;
}

HostTensor transposed(const HostTensor& t) {
  HostTensor o;
  const int64_t rows = t.shape.at(0), cols = t.shape.at(1);
  o.shape = {cols, rows};
  o.data.resize(t.data.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) o.data[size_t(j * rows + i)] = t.data[size_t(i * cols + j)];
  return o;
}

HostTensor rows_concat(const std::vector<const HostTensor*>& parts) {
  HostTensor o;
  o.shape = parts.front()->shape;
  o.shape[0] = 0;
  for (const HostTensor* p : parts) {
    o.shape[0] += p->shape[0];
    o.data.insert(o.data.end(), p->data.begin(), p->data.end());
  }
  return o;
}

HostTensor rows_slice(const HostTensor& t, int64_t begin, int64_t rows) {
  HostTensor o;
  o.shape = t.shape;
  o.shape[0] = rows;
  const int64_t row = t.numel() / t.shape[0];
  o.data.assign(t.data.begin() + begin * row, t.data.begin() + (begin + rows) * row);
  return o;
}

std::string expert_name(const std::string& pattern, int64_t e) {
  const size_t at = pattern.find("{e}");
  return pattern.substr(0, at) + std::to_string(e) + pattern.substr(at + 3);
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

}  // namespace

TensorMap to_hf(const Config& c, const TensorMap& ours) {
  TensorMap out;
  auto get = [&](const std::string& n) -> const HostTensor& {
    auto it = ours.find(n);
    if (it == ours.end()) throw std::runtime_error("export: the checkpoint holds no tensor model/" + n);
    return it->second;
  };
  for (const Rule& r : rules(c)) {
    switch (r.kind) {
      case Rule::Same: out[r.hf] = get(r.ours[0]); break;
      case Rule::Transposed: out[r.hf] = transposed(get(r.ours[0])); break;
      case Rule::FusedQkvTransposed:
        out[r.hf] = transposed(rows_concat({&get(r.ours[0]), &get(r.ours[1]), &get(r.ours[2])}));
        break;
      case Rule::FusedQkvBias: out[r.hf] = rows_concat({&get(r.ours[0]), &get(r.ours[1]), &get(r.ours[2])}); break;
      case Rule::Experts: {
        const HostTensor& all = get(r.ours[0]);
        for (int64_t e = 0; e < all.shape[0]; ++e) {
          HostTensor one = rows_slice(all, e, 1);
          one.shape.erase(one.shape.begin());
          out[expert_name(r.hf, e)] = std::move(one);
        }
        break;
      }
    }
  }
  return out;
}

TensorMap from_hf(const Config& c, const TensorMap& hf, const std::string& where) {
  // Our shapes, from the parameter list of one process.
  const ModelDims d = make_dims(c, 1, 1);
  std::map<std::string, std::vector<int64_t>> want;
  for (const ParamInfo& p : parameter_list(d, c.model.init_std)) want[p.spec.name] = p.spec.shape;
  std::vector<std::string> problems;
  std::set<std::string> used;
  auto take = [&](const std::string& name, const std::vector<int64_t>& shape) -> const HostTensor* {
    auto it = hf.find(name);
    if (it == hf.end()) {
      problems.push_back("missing tensor " + name + " (expected shape " + shape_text(shape) + ")");
      return nullptr;
    }
    used.insert(name);
    if (it->second.shape != shape) {
      problems.push_back(name + " has shape " + shape_text(it->second.shape) + ", the model configuration needs " +
                         shape_text(shape));
      return nullptr;
    }
    return &it->second;
  };
  TensorMap out;
  for (const Rule& r : rules(c)) {
    const std::vector<int64_t>& s0 = want.at(r.ours[0]);
    switch (r.kind) {
      case Rule::Same:
        if (const HostTensor* t = take(r.hf, s0)) out[r.ours[0]] = *t;
        break;
      case Rule::Transposed:
        if (const HostTensor* t = take(r.hf, {s0[1], s0[0]})) out[r.ours[0]] = transposed(*t);
        break;
      case Rule::FusedQkvTransposed: {
        const int64_t q = s0[0], k = want.at(r.ours[1])[0], v = want.at(r.ours[2])[0];
        if (const HostTensor* t = take(r.hf, {s0[1], q + k + v})) {
          const HostTensor all = transposed(*t);
          out[r.ours[0]] = rows_slice(all, 0, q);
          out[r.ours[1]] = rows_slice(all, q, k);
          out[r.ours[2]] = rows_slice(all, q + k, v);
        }
        break;
      }
      case Rule::FusedQkvBias: {
        const int64_t q = s0[0], k = want.at(r.ours[1])[0], v = want.at(r.ours[2])[0];
        if (const HostTensor* t = take(r.hf, {q + k + v})) {
          out[r.ours[0]] = rows_slice(*t, 0, q);
          out[r.ours[1]] = rows_slice(*t, q, k);
          out[r.ours[2]] = rows_slice(*t, q + k, v);
        }
        break;
      }
      case Rule::Experts: {
        const std::vector<int64_t> one(s0.begin() + 1, s0.end());
        std::vector<const HostTensor*> parts;
        for (int64_t e = 0; e < s0[0]; ++e) parts.push_back(take(expert_name(r.hf, e), one));
        bool all = true;
        for (const HostTensor* p : parts) all = all && p;
        if (all) {
          HostTensor t;
          t.shape = s0;
          for (const HostTensor* p : parts) t.data.insert(t.data.end(), p->data.begin(), p->data.end());
          out[r.ours[0]] = std::move(t);
        }
        break;
      }
    }
  }
  for (const auto& [name, t] : hf) {
    if (used.count(name)) continue;
    // A tied model's head may be saved too (it is the embedding); GPT-2's
    // causal-mask buffers of older versions carry no weights.
    if (name == "lm_head.weight" && c.model.tied()) continue;
    if (name.size() > 9 && (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias"))) continue;
    // Older llama directories saved RoPE's frequencies as a buffer: they must
    // be the ones the model configuration makes (a scaling config.json does
    // not state would show here). bf16 files round them to 3 digits.
    if (name.ends_with(".self_attn.rotary_emb.inv_freq")) {
      const std::vector<double> ours = ops::rope_inv_freqs(c.head_dim(), rope_of(c.model));
      double worst = t.data.size() == ours.size() ? 0.0 : 1.0;
      for (size_t i = 0; worst < 1.0 && i < ours.size(); ++i)
        worst = std::max(worst, std::fabs(double(t.data[i]) - ours[i]) / ours[i]);
      if (worst > 1e-2)
        problems.push_back(name + " " + shape_text(t.shape) + " holds RoPE frequencies that model.rope_theta=" +
                           std::to_string(c.model.rope_theta) + " and model.rope_scaling do not make (worst " +
                           "relative difference " + std::to_string(worst) + ")");
      continue;
    }
    problems.push_back("unexpected tensor " + name + " " + shape_text(t.shape) + " (no parameter of this model maps to it)");
  }
  if (!problems.empty()) {
    std::string msg = where + ": the weights do not fit the model configuration (" + std::to_string(problems.size()) +
                      " problem(s)):";
    for (const std::string& p : problems) msg += "\n  " + p;
    throw ConfigError(msg);
  }
  return out;
}

}  // namespace trainer
