// model.init_from's config.json as the model configuration's source
// (interop/hf_import.h: adopt_init_from_settings): every model key the YAML
// and the overrides leave unset is taken from the directory, so a run starts
// from a Hugging Face model without restating its architecture. A key the
// configuration does set is compared with the file later (review_hf_config)
// and refused on a difference, as before.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "interop/hf_files.h"
#include "interop/hf_import.h"

namespace trainer {

namespace {

// One adoption: our key, its value as printed, and the setter.
struct Taker {
  Config& c;
  const json::Value& hf;
  std::vector<std::string> taken;

  // The first of `names` present in config.json as an integer.
  const json::Value* integer(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (const json::Value* v = json::find(hf, n); v && v->is_number_integer()) return v;
    return nullptr;
  }
  const json::Value* number(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (const json::Value* v = json::find(hf, n); v && v->is_number()) return v;
    return nullptr;
  }
  // Sets `key` unless the configuration named it.
  void take(const std::string& key, const std::string& shown, const std::function<void()>& set) {
    if (c.given.count(key)) return;
    set();
    taken.push_back(key + "=" + shown);
  }
  void take_int(const std::string& key, int& field, std::initializer_list<const char*> names) {
    if (const json::Value* v = integer(names); v && v->get<int64_t>() > 0 && v->get<int64_t>() < (int64_t(1) << 31))
      take(key, std::to_string(v->get<int64_t>()), [&] { field = int(v->get<int64_t>()); });
  }
  void take_real(const std::string& key, double& field, std::initializer_list<const char*> names) {
    if (const json::Value* v = number(names); v && std::isfinite(v->get<double>()))
      take(key, json::dump(*v), [&] { field = v->get<double>(); });
  }
};

std::string architecture_of(const json::Value& hf) {
  const json::Value* a = json::find(hf, "architectures");
  return a && a->is_array() && a->size() == 1 && (*a)[0].is_string() ? (*a)[0].get<std::string>() : "";
}

// RoPE scaling of a llama-family file: linear and llama3 (others are refused
// by review_hf_config, so nothing is taken from them).
void take_rope_scaling(Taker& t) {
  const json::Value* rs = json::find(t.hf, "rope_scaling");
  RopeScalingConfig& ours = t.c.model.rope_scaling;
  if (!rs || rs->is_null()) return t.take("model.rope_scaling.type", "none", [&] { ours.type = "none"; });
  const json::Value* type = json::find(*rs, "rope_type");
  if (!type) type = json::find(*rs, "type");
  if (!type || !type->is_string()) return;
  const std::string ty = type->get<std::string>();
  if (ty != "linear" && ty != "llama3") return;
  t.take("model.rope_scaling.type", ty, [&] { ours.type = ty; });
  const auto real = [&](const char* field, const char* key, double& into) {
    if (const json::Value* v = json::find(*rs, field); v && v->is_number())
      t.take(key, json::dump(*v), [&] { into = v->get<double>(); });
  };
  real("factor", "model.rope_scaling.factor", ours.factor);
  if (ty != "llama3") return;
  real("low_freq_factor", "model.rope_scaling.low_freq_factor", ours.low_freq_factor);
  real("high_freq_factor", "model.rope_scaling.high_freq_factor", ours.high_freq_factor);
  if (const json::Value* v = json::find(*rs, "original_max_position_embeddings"); v && v->is_number_integer())
    t.take("model.rope_scaling.original_max_seq_len", json::dump(*v),
           [&] { ours.original_max_seq_len = int(v->get<int64_t>()); });
}

void take_llama_family(Taker& t, const std::string& arch) {
  ModelConfig& m = t.c.model;
  const bool mixtral = arch == "MixtralForCausalLM";
  t.take_int(mixtral ? "model.moe.d_ff" : "model.d_ff", mixtral ? m.moe.d_ff : m.d_ff, {"intermediate_size"});
  // Absent: as many key/value heads as query heads (transformers' default).
  if (t.integer({"num_key_value_heads"}))
    t.take_int("model.n_kv_heads", m.n_kv_heads, {"num_key_value_heads"});
  else
    t.take("model.n_kv_heads", "0 (num_key_value_heads absent: n_heads)", [&] { m.n_kv_heads = 0; });
  t.take_real("model.norm_eps", m.norm_eps, {"rms_norm_eps"});
  t.take_real("model.rope_theta", m.rope_theta, {"rope_theta"});
  take_rope_scaling(t);
  if (arch == "Qwen2ForCausalLM") t.take("model.attn_bias", "qkv", [&] { m.attn_bias = "qkv"; });
  if (arch == "LlamaForCausalLM") {
    const json::Value* b = json::find(t.hf, "attention_bias");
    const bool qkvo = b && b->is_boolean() && b->get<bool>();
    t.take("model.attn_bias", qkvo ? "qkvo" : "none", [&] { m.attn_bias = qkvo ? "qkvo" : "none"; });
  }
  if (arch == "MistralForCausalLM" || mixtral) {
    // Mistral's default window is 4096, Mixtral's none; null is none.
    const json::Value* w = json::find(t.hf, "sliding_window");
    const int64_t win = !w ? (mixtral ? 0 : 4096) : w->is_number_integer() ? w->get<int64_t>() : 0;
    if (win >= 0 && win < (int64_t(1) << 31))
      t.take("model.sliding_window", std::to_string(win), [&] { m.sliding_window = int(win); });
  }
  if (mixtral) {
    t.take_int("model.moe.num_experts", m.moe.num_experts, {"num_local_experts"});
    t.take_int("model.moe.top_k", m.moe.top_k, {"num_experts_per_tok"});
    t.take_real("model.moe.aux_loss_coeff", m.moe.aux_loss_coeff, {"router_aux_loss_coef"});
  }
}

}  // namespace

std::vector<std::string> adopt_init_from_settings(Config& c) {
  std::vector<std::string> lines;
  if (c.model.init_from.empty()) return lines;
  json::Value hf;
  try {
    hf = read_hf_config(c.model.init_from);
  } catch (const std::exception&) {
    return lines;  // load_init_weights says why
  }
  if (!hf.is_object()) return lines;
  const std::string arch = architecture_of(hf);
  const bool gpt2 = arch == "GPT2LMHeadModel";
  const bool llama = arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM" ||
                     arch == "MixtralForCausalLM";
  if (!gpt2 && !llama) return lines;  // review_hf_config names the architecture it refuses
  Taker t{c, hf, {}};
  ModelConfig& m = c.model;
  t.take("model.arch", gpt2 ? "gpt2" : "llama", [&] { m.arch = gpt2 ? "gpt2" : "llama"; });
  t.take_int("model.vocab_size", m.vocab_size, {"vocab_size"});
  t.take_int("model.d_model", m.d_model, {"hidden_size", "n_embd"});
  t.take_int("model.n_layers", m.n_layers, {"num_hidden_layers", "n_layer"});
  t.take_int("model.n_heads", m.n_heads, {"num_attention_heads", "n_head"});
  t.take_int("model.max_seq_len", m.max_seq_len, {"max_position_embeddings", "n_positions"});
  if (const json::Value* tie = json::find(hf, "tie_word_embeddings"); tie && tie->is_boolean())
    t.take("model.tie_embeddings", tie->get<bool>() ? "true" : "false",
           [&] { m.tie_embeddings = tie->get<bool>() ? "true" : "false"; });
  else
    t.take("model.tie_embeddings", gpt2 ? "true" : "false", [&] { m.tie_embeddings = gpt2 ? "true" : "false"; });
  if (gpt2) {
    t.take_real("model.norm_eps", m.norm_eps, {"layer_norm_epsilon"});
    if (const json::Value* inner = json::find(hf, "n_inner"); inner && inner->is_number_integer())
      t.take_int("model.d_ff", m.d_ff, {"n_inner"});
    else
      t.take("model.d_ff", "0 (n_inner null: 4 d_model)", [&] { m.d_ff = 0; });
  } else {
    take_llama_family(t, arch);
  }
  if (!t.taken.empty()) {
    std::string line = "init: from " + c.model.init_from + "/config.json (" + arch + "), the keys the configuration " +
                       "leaves unset:";
    for (const std::string& k : t.taken) line += " " + k;
    lines.push_back(line);
  }
  return lines;
}

}  // namespace trainer
