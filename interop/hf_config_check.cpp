#include "interop/hf_config_check.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "interop/hf_format.h"

namespace trainer {
namespace {

std::string shown(const json::Value& v) {
  std::string s = json::dump(v);
  return s.size() > 160 ? s.substr(0, 157) + "..." : s;
}

std::string num(double v) { return shown(json::Value(v)); }

bool same_number(double a, double b) { return a == b || std::fabs(a - b) <= 1e-12 * std::fabs(b); }

bool same_value(const json::Value& a, const json::Value& b) {
  if (a.is_number() && b.is_number()) return same_number(a.get<double>(), b.get<double>());
  return a == b;
}

bool is_zero(const json::Value& v) { return v.is_null() || (v.is_number() && v.get<double>() == 0.0); }

// config.json keys that never change what the weights compute, in any of the
// architectures read here (PretrainedConfig's own and its generation
// defaults, ids of special tokens, bookkeeping).
const std::set<std::string>& no_effect_keys() {
  static const std::set<std::string> keys = {
      // bookkeeping and loading
      "_name_or_path", "transformers_version", "torch_dtype", "use_cache", "initializer_range", "use_bfloat16",
      "torchscript", "tf_legacy_loss", "_attn_implementation", "_commit_hash",
      // special tokens
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      // outputs
      "return_dict", "output_attentions", "output_hidden_states", "output_scores", "return_dict_in_generate",
      // generation defaults
      "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "forced_bos_token_id",
      "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
      "begin_suppress_tokens",
      // task heads other than the causal LM, tokenizer hints
      "finetuning_task", "id2label", "label2id", "problem_type", "task_specific_params", "prefix", "tokenizer_class",
      // decoder-only models ignore it; feed-forward chunking computes the same values in pieces
      "is_decoder", "chunk_size_feed_forward",
  };
  return keys;
}

struct Checker {
  const Config& c;
  const std::string arch;       // what the model configuration exports as
  const std::string file_arch;  // what config.json says (Llama and Mistral stand for each other)
  HfConfigReview& r;

  void differ(const std::string& key, const json::Value& theirs, const std::string& ours) const {
    r.problems.push_back(key + "=" + shown(theirs) + " in config.json, " + ours);
  }
  void refuse(const std::string& key, const json::Value& theirs, const std::string& why) const {
    r.problems.push_back(key + "=" + shown(theirs) + " in config.json: " + why);
  }
  // Accepted only with its no-op value.
  void only(const std::string& key, const json::Value& v, const json::Value& noop, const std::string& why) const {
    if (!same_value(v, noop) && !(noop.is_null() && v.is_null())) refuse(key, v, why);
  }
  void note_dropout(const std::string& key, const json::Value& v) const {
    if (!is_zero(v))
      r.notes.push_back(key + "=" + shown(v) + " in config.json: this trainer applies no dropout (the function of "
                        "the weights is the same; training is without it)");
  }
  bool llama_family() const { return arch != "GPT2LMHeadModel"; }
};

// ---- rope_scaling ------------------------------------------------------------
void check_rope_scaling(const Checker& k, const json::Value& v) {
  const RopeScalingConfig& ours = k.c.model.rope_scaling;
  const std::string ours_text = "model.rope_scaling = " + shown(hf_rope_scaling(ours)) +
                                " (model.rope_scaling.type=" + ours.type + ")";
  if (v.is_null()) {
    if (ours.type != "none") k.differ("rope_scaling", v, ours_text);
    return;
  }
  if (!v.is_object()) return k.refuse("rope_scaling", v, "expected null or an object");
  const json::Value* a = json::find(v, "rope_type");
  const json::Value* b = json::find(v, "type");
  if ((a && !a->is_string()) || (b && !b->is_string()) || (!a && !b))
    return k.refuse("rope_scaling", v, "no \"rope_type\" (or \"type\") string");
  if (a && b && *a != *b) return k.refuse("rope_scaling", v, "\"rope_type\" and \"type\" differ");
  const std::string type = (a ? *a : *b).get<std::string>();
  std::vector<std::pair<std::string, double>> fields;  // config.json field, our value
  if (type == "default") {
  } else if (type == "linear") {
    fields = {{"factor", ours.factor}};
  } else if (type == "llama3") {
    fields = {{"factor", ours.factor},
              {"low_freq_factor", ours.low_freq_factor},
              {"high_freq_factor", ours.high_freq_factor},
              {"original_max_position_embeddings", double(ours.original_max_seq_len)}};
  } else {
    return k.refuse("rope_scaling", v,
                    "RoPE scaling type '" + type + "' is not implemented in this trainer (supported: linear, llama3)");
  }
  for (const auto& [field, value] : v.items()) {
    bool known = field == "rope_type" || field == "type";
    for (const auto& f : fields) known = known || f.first == field;
    if (!known)
      return k.refuse("rope_scaling", v, "field \"" + field + "\" is not known to this trainer for type '" + type +
                                             "' (it would be ignored, and may change the frequencies)");
  }
  const std::string want_type = type == "default" ? "none" : type;
  bool same = ours.type == want_type;
  for (const auto& [field, value] : fields) {
    const json::Value* f = json::find(v, field);
    if (!f || !f->is_number()) return k.refuse("rope_scaling", v, "'" + type + "' needs a number \"" + field + "\"");
    same = same && same_number(f->get<double>(), value);
  }
  if (!same) k.differ("rope_scaling", v, ours_text);
}

// ---- sliding-window attention (the one place that reads it) ------------------
// model.sliding_window W: a query sees itself and the W keys before it, as
// Mistral's and Mixtral's `sliding_window` (absent: their defaults, 4096 and
// null). Llama has no window whatever the file says. A window the run's
// sequences never reach (W >= train.seq_len - 1) masks nothing, so config.json
// and the model configuration are compared by what they mask at
// train.seq_len. Qwen2 uses a window only with use_sliding_window: true, and
// then per layer (max_window_layers), which is not implemented: refused.
int64_t effective_window(int64_t w, int64_t T) { return w > 0 && w < T - 1 ? w : 0; }

void check_sliding_window(const Checker& k, const json::Value& hf) {
  const std::string& arch = k.file_arch;
  const json::Value* w = json::find(hf, "sliding_window");
  const json::Value* use = json::find(hf, "use_sliding_window");
  if (use && !use->is_boolean()) k.refuse("use_sliding_window", *use, "expected true or false");
  if (w && !w->is_null() && (!w->is_number_integer() || w->get<int64_t>() < 1))
    return k.refuse("sliding_window", *w, "expected null or a positive integer");
  const int64_t T = k.c.train.seq_len, ours = k.c.model.sliding_window;
  if (arch == "Qwen2ForCausalLM") {
    if (use && use->is_boolean() && use->get<bool>() && w && !w->is_null() && effective_window(w->get<int64_t>(), T))
      k.refuse("use_sliding_window", *use,
               "Qwen2's per-layer sliding window (max_window_layers) is not implemented in this trainer; a "
               "train.seq_len <= sliding_window + 1 trains the same model");
    return;
  }
  const bool keyed = arch == "MistralForCausalLM" || arch == "MixtralForCausalLM";
  const int64_t theirs = !keyed ? 0 : !w ? (arch == "MistralForCausalLM" ? 4096 : 0) : w->is_null() ? 0 : w->get<int64_t>();
  if (effective_window(theirs, T) == effective_window(ours, T)) return;
  const json::Value shown_w = w ? *w : json::Value(keyed && theirs ? "(absent: 4096)" : "(absent: none)");
  k.r.problems.push_back(
      (keyed ? "sliding_window=" + shown(shown_w) + " in config.json (" + arch + ")"
             : "config.json describes a " + arch + " (no sliding window)") +
      ", model.sliding_window = " + std::to_string(ours) + ": at train.seq_len=" + std::to_string(T) +
      " they mask different keys (a window W lets a query see itself and the W keys before it; W >= seq_len - 1, "
      "null or 0 is full causal attention)");
}
const std::set<std::string> kSlidingWindowKeys = {"sliding_window", "use_sliding_window", "max_window_layers"};
// ---- end of sliding-window attention -------------------------------------------

// Keys this trainer reads beyond the compared ones, per architecture family.
using Handler = std::function<void(const Checker&, const json::Value&)>;

std::map<std::string, Handler> handlers(const Checker& k) {
  std::map<std::string, Handler> h;
  // Every architecture: structure flags of PretrainedConfig, accepted only
  // at the value a decoder-only model has; formats this trainer cannot read.
  h["is_encoder_decoder"] = [](const Checker& k, const json::Value& v) {
    k.only("is_encoder_decoder", v, false, "an encoder-decoder model is not a causal LM this trainer has");
  };
  h["add_cross_attention"] = [](const Checker& k, const json::Value& v) {
    k.only("add_cross_attention", v, false, "cross-attention layers are not implemented in this trainer");
  };
  h["tie_encoder_decoder"] = [](const Checker& k, const json::Value& v) {
    k.only("tie_encoder_decoder", v, false, "an encoder-decoder model is not a causal LM this trainer has");
  };
  h["cross_attention_hidden_size"] = [](const Checker& k, const json::Value& v) {
    k.only("cross_attention_hidden_size", v, nullptr, "cross-attention layers are not implemented in this trainer");
  };
  h["pruned_heads"] = [](const Checker& k, const json::Value& v) {
    if (!(v.is_null() || (v.is_object() && v.empty())))
      k.refuse("pruned_heads", v, "pruned attention heads are not implemented in this trainer");
  };
  h["quantization_config"] = [](const Checker& k, const json::Value& v) {
    k.refuse("quantization_config", v,
             "quantized weights are not read by this trainer (save a dequantized model: F32, BF16 or F16)");
  };
  h["auto_map"] = [](const Checker& k, const json::Value& v) {
    k.refuse("auto_map", v, "the model comes with its own modeling code, which this trainer cannot follow");
  };
  if (k.arch == "GPT2LMHeadModel") {
    for (const char* d : {"resid_pdrop", "embd_pdrop", "attn_pdrop"})
      h[d] = [d](const Checker& k, const json::Value& v) { k.note_dropout(d, v); };
    h["scale_attn_weights"] = [](const Checker& k, const json::Value& v) {
      k.only("scale_attn_weights", v, true, "attention scores without the 1/sqrt(head_dim) scale are not implemented");
    };
    h["scale_attn_by_inverse_layer_idx"] = [](const Checker& k, const json::Value& v) {
      k.only("scale_attn_by_inverse_layer_idx", v, false,
             "attention scores scaled by 1/(layer index + 1) are not implemented");
    };
    // fp32 here, so the order of the upcast changes nothing; the summary_*
    // keys configure GPT2DoubleHeadsModel's classifier, not the LM head.
    for (const char* n : {"reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
                          "summary_proj_to_labels", "summary_first_dropout"})
      h[n] = [](const Checker&, const json::Value&) {};
    return h;
  }
  h["rope_scaling"] = check_rope_scaling;
  h["attention_dropout"] = [](const Checker& k, const json::Value& v) { k.note_dropout("attention_dropout", v); };
  h["head_dim"] = [](const Checker& k, const json::Value& v) {
    if (v.is_null()) return;
    if (!v.is_number_integer() || v.get<int64_t>() != k.c.head_dim())
      k.refuse("head_dim", v,
               "model.d_model / model.n_heads = " + std::to_string(k.c.head_dim()) +
                   "; a head_dim other than hidden_size / num_attention_heads is not implemented in this trainer");
  };
  h["partial_rotary_factor"] = [](const Checker& k, const json::Value& v) {
    k.only("partial_rotary_factor", v, 1.0, "RoPE on part of each head is not implemented in this trainer");
  };
  for (const std::string& s : kSlidingWindowKeys)
    h[s] = [](const Checker&, const json::Value&) {};  // check_sliding_window reads them together
  if (k.file_arch == "LlamaForCausalLM") {
    h["attention_bias"] = [](const Checker& k, const json::Value& v) {
      if (!v.is_boolean()) return k.refuse("attention_bias", v, "expected true or false");
      if (v.get<bool>() != (k.c.model.attn_bias == "qkvo"))
        k.differ("attention_bias", v, "model.attn_bias = " + k.c.model.attn_bias +
                                          " (attention_bias: true is model.attn_bias=qkvo, false is none)");
    };
    h["mlp_bias"] = [](const Checker& k, const json::Value& v) {
      k.only("mlp_bias", v, false, "MLP biases are not implemented in this trainer");
    };
    // pretraining_tp > 1 computes the same projections in slices.
    h["pretraining_tp"] = [](const Checker&, const json::Value&) {};
  }
  if (k.arch == "MixtralForCausalLM") {
    h["attention_bias"] = [](const Checker& k, const json::Value& v) {
      k.only("attention_bias", v, false, "MixtralForCausalLM has no attention biases (transformers ignores the key)");
    };
    h["router_aux_loss_coef"] = [](const Checker& k, const json::Value& v) {
      if (!v.is_number()) return k.refuse("router_aux_loss_coef", v, "expected a number");
      const double ours = k.c.model.moe.aux_loss_coeff;
      if (!same_number(v.get<double>(), ours))
        k.r.notes.push_back("model.moe.aux_loss_coeff=" + num(ours) + " (set in the configuration) wins over "
                            "router_aux_loss_coef=" + shown(v) + " of config.json");
    };
    h["output_router_logits"] = [](const Checker&, const json::Value&) {};  // always computed here
    h["router_jitter_noise"] = [](const Checker& k, const json::Value& v) {
      if (!is_zero(v))
        k.r.notes.push_back("router_jitter_noise=" + shown(v) + " in config.json: this trainer routes without "
                            "jitter (the function of the weights is the same; training is without it)");
    };
  }
  return h;
}

}  // namespace

HfConfigReview review_hf_config(const Config& c, const json::Value& hf) {
  HfConfigReview r;
  if (!hf.is_object()) {
    r.problems.push_back("config.json is " + shown(hf) + ", not a JSON object");
    return r;
  }
  std::string arch;
  try {
    arch = hf_architecture(c);
  } catch (const ConfigError& e) {
    r.problems.push_back(e.what());
    return r;
  }
  const json::Value* archs = json::find(hf, "architectures");
  const std::string theirs = archs && archs->is_array() && archs->size() == 1 && (*archs)[0].is_string()
                                 ? (*archs)[0].get<std::string>()
                                 : std::string();
  // Llama and Mistral hold the same tensors; whether a window makes one of
  // them the other is settled by the sliding_window comparison.
  const auto llama_like = [](const std::string& a) { return a == "LlamaForCausalLM" || a == "MistralForCausalLM"; };
  if (theirs != arch && !(llama_like(theirs) && llama_like(arch))) {
    r.problems.push_back(
        "architectures=" + (archs ? shown(*archs) : std::string("(absent)")) +
        " in config.json, but the model configuration (model.arch=" + c.model.arch +
        (c.model.moe.num_experts ? ", model.moe" : "") + ", model.attn_bias=" + c.model.attn_bias +
        (c.model.sliding_window > 0 ? ", model.sliding_window" : "") + ") is a " + arch +
        " (supported: LlamaForCausalLM, MistralForCausalLM = llama with model.sliding_window, Qwen2ForCausalLM = "
        "llama with model.attn_bias=qkv, GPT2LMHeadModel, MixtralForCausalLM)");
    return r;
  }
  const Checker k{c, arch, theirs, r};
  const json::Value want = hf_config(c, "float32");
  // The keys that decide shapes and the math; ours are named beside them.
  const std::map<std::string, std::string> compared = {
      {"vocab_size", "model.vocab_size"},         {"hidden_size", "model.d_model"},
      {"n_embd", "model.d_model"},                {"intermediate_size", "model.d_ff (moe.d_ff for Mixtral)"},
      {"n_inner", "model.d_ff"},                  {"num_hidden_layers", "model.n_layers"},
      {"n_layer", "model.n_layers"},              {"num_attention_heads", "model.n_heads"},
      {"n_head", "model.n_heads"},                {"num_key_value_heads", "model.n_kv_heads"},
      {"max_position_embeddings", "model.max_seq_len"}, {"n_positions", "model.max_seq_len"},
      {"n_ctx", "model.max_seq_len"},             {"rms_norm_eps", "model.norm_eps"},
      {"layer_norm_epsilon", "model.norm_eps"},   {"rope_theta", "model.rope_theta"},
      {"tie_word_embeddings", "model.tie_embeddings"}, {"num_local_experts", "model.moe.num_experts"},
      {"num_experts_per_tok", "model.moe.top_k"}, {"hidden_act", "(silu for llama)"},
      {"activation_function", "(gelu_new for gpt2)"}, {"model_type", "(from the architecture)"},
  };
  for (const auto& [key, ours] : compared) {
    const json::Value* w = json::find(want, key);
    if (!w) continue;
    const json::Value* h = json::find(hf, key);
    if (!h || h->is_null()) {
      // Hugging Face's defaults for keys a config.json may leave out.
      if (key == "num_key_value_heads" && c.kv_heads() == c.model.n_heads) continue;
      if (key == "n_inner" && c.d_ff() == 4 * c.model.d_model) continue;
      if (key == "tie_word_embeddings" && c.model.tied() == (arch == "GPT2LMHeadModel")) continue;
      if (key == "rope_theta" && c.model.rope_theta == 10000.0) continue;
      if (key == "n_ctx" || key == "activation_function" || key == "hidden_act" || key == "model_type") continue;
      r.problems.push_back(key + " is absent from config.json; " + ours + " = " + shown(*w));
      continue;
    }
    // Llama for Mistral or back: the architecture check above stands for it.
    if (key == "model_type" && theirs != arch) continue;
    if (!same_value(*w, *h)) k.differ(key, *h, ours + " = " + shown(*w));
  }
  const auto read = handlers(k);
  for (const auto& [key, value] : hf.items()) {
    if (key == "architectures" || (compared.count(key) && json::find(want, key)) || no_effect_keys().count(key))
      continue;
    if (auto it = read.find(key); it != read.end()) {
      it->second(k, value);
      continue;
    }
    r.problems.push_back(key + "=" + shown(value) + " in config.json is not known to this trainer for " + arch +
                         "; if it does not change the model, remove it from config.json, otherwise the model "
                         "cannot be trained here");
  }
  if (k.llama_family()) {
    check_sliding_window(k, hf);
    // An absent rope_scaling is null.
    if (!json::find(hf, "rope_scaling")) check_rope_scaling(k, nullptr);
    // Llama without attention_bias means false.
    if (theirs == "LlamaForCausalLM" && !json::find(hf, "attention_bias") && c.model.attn_bias != "none")
      k.differ("attention_bias", false, "model.attn_bias = " + c.model.attn_bias + " (attention_bias absent: false)");
  }
  return r;
}

}  // namespace trainer
