// config.json key by key (interop/hf_config_check.h): our own exports
// read back clean, every refused key and an unknown one are named, no-op
// values of refused keys pass, differences name both keys; the Qwen2 and
// Llama bias tensors map both ways; router_aux_loss_coef fills the MoE
// coefficient only when the configuration does not set it. The logits of
// these models against transformers are tests/hf/hf_features_test.py's.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "interop/hf_config_check.h"
#include "interop/hf_format.h"
#include "model/dims.h"
#include "model/params.h"
#include "temp_dir.h"
#include "interop/hf_import.h"

using namespace trainer;

namespace {

const char* const kLlama =
    "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 64}";

Config config_of(const std::string& model, const std::vector<std::string>& sets = {}) {
  return load_config_text("model: " + model + "\ntrain: {seq_len: 32}\ndata: {train: [x.bin]}\n", "<test>", sets);
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += l + "\n";
  return s;
}

// The review of `hf` must hold exactly one problem, containing every part.
void refused(const Config& c, const json::Value& hf, std::initializer_list<const char*> parts) {
  const HfConfigReview r = review_hf_config(c, hf);
  std::printf("[refused] %s", joined(r.problems).c_str());
  INFO(joined(r.problems));
  REQUIRE(r.problems.size() == 1);
  for (const char* p : parts) CHECK(r.problems[0].find(p) != std::string::npos);
}

void accepted(const Config& c, const json::Value& hf) {
  const HfConfigReview r = review_hf_config(c, hf);
  INFO(joined(r.problems));
  CHECK(r.problems.empty());
}

}  // namespace

TEST_CASE("config.json written by export reads back without a problem, every architecture and feature", "[hf]") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {kLlama, {}},
      {kLlama, {"model.attn_bias=qkvo", "model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
                "model.rope_scaling.original_max_seq_len=16"}},
      {kLlama, {"model.attn_bias=qkv", "model.rope_scaling.type=linear", "model.rope_scaling.factor=2"}},
      {kLlama, {"model.moe.num_experts=4", "model.moe.aux_loss_coeff=0.02"}},
      {"{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 64}", {}},
  };
  for (const auto& [model, sets] : models) {
    const Config c = config_of(model, sets);
    const json::Value j = hf_config(c, "bfloat16");
    std::printf("[export] %s: %s\n", hf_architecture(c).c_str(), json::dump(j).c_str());
    const HfConfigReview r = review_hf_config(c, j);
    INFO(json::dump(j) << "\n" << joined(r.problems));
    CHECK(r.problems.empty());
    CHECK(r.notes.empty());
  }
  // The architecture follows the biases: q/k/v only is Qwen2.
  CHECK(hf_architecture(config_of(kLlama, {"model.attn_bias=qkv"})) == "Qwen2ForCausalLM");
  CHECK(hf_architecture(config_of(kLlama, {"model.attn_bias=qkvo"})) == "LlamaForCausalLM");
  const json::Value q = hf_config(config_of(kLlama, {"model.attn_bias=qkv"}), "float32");
  CHECK(q["model_type"] == "qwen2");
  CHECK(q["use_sliding_window"] == false);
  const json::Value l3 = hf_config(config_of(kLlama, {"model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
                                                      "model.rope_scaling.original_max_seq_len=8192"}),
                                   "float32");
  CHECK(json::dump(l3["rope_scaling"]) ==
        R"({"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
        R"("original_max_position_embeddings":8192})");
  REQUIRE_THROWS_WITH(hf_architecture(config_of(kLlama, {"model.attn_bias=qkv", "model.moe.num_experts=4"})),
                      Catch::Contains("MixtralForCausalLM has no attention biases"));
}

TEST_CASE("config.json: refused keys and unknown ones are named with their value, their no-op values pass", "[hf]") {
  const Config c = config_of(kLlama);
  const json::Value base = hf_config(c, "float32");
  auto with = [&](const std::string& key, const json::Value& v) {
    json::Value j = base;
    j[key] = v;
    return j;
  };
  refused(c, with("rope_scaling", json::parse(R"({"rope_type": "yarn", "factor": 4.0})")),
          {"rope_scaling=", "'yarn' is not implemented", "linear, llama3"});
  refused(c, with("rope_scaling", json::parse(R"({"type": "dynamic", "factor": 2.0})")), {"'dynamic'"});
  refused(c, with("rope_scaling", json::parse(R"({"rope_type": "linear", "factor": 2.0, "beta": 1})")),
          {"\"beta\" is not known"});
  refused(c, with("mlp_bias", true), {"mlp_bias=true", "MLP biases are not implemented"});
  refused(c, with("head_dim", 16), {"head_dim=16", "model.d_model / model.n_heads = 8"});
  refused(c, with("partial_rotary_factor", 0.5), {"partial_rotary_factor=0.5"});
  refused(c, with("quantization_config", json::parse(R"({"quant_method": "gptq"})")), {"quantization_config=", "quantized"});
  refused(c, with("auto_map", json::parse(R"({"AutoModel": "x.Y"})")), {"auto_map="});
  refused(c, with("pruned_heads", json::parse(R"({"0": [1]})")), {"pruned_heads="});
  refused(c, with("add_cross_attention", true), {"add_cross_attention=true"});
  refused(c, with("frobnicate", 3), {"frobnicate=3", "not known to this trainer", "if it does not change the model"});
  // Their values that change nothing.
  accepted(c, with("rope_scaling", nullptr));
  accepted(c, with("rope_scaling", json::parse(R"({"rope_type": "default"})")));
  accepted(c, with("mlp_bias", false));
  accepted(c, with("head_dim", 8));
  accepted(c, with("sliding_window", nullptr));
  accepted(c, with("sliding_window", 32));
  // LlamaForCausalLM has no window, whatever the file says.
  accepted(c, with("sliding_window", 16));
  // A Mistral's window must mask what model.sliding_window masks at train.seq_len.
  const Config cw = config_of(kLlama, {"model.sliding_window=16"});
  json::Value mistral = hf_config(cw, "float32");
  CHECK(mistral["architectures"][0] == "MistralForCausalLM");
  accepted(cw, mistral);
  refused(c, mistral, {"sliding_window=16 in config.json (MistralForCausalLM)", "model.sliding_window = 0",
                       "mask different keys"});
  mistral["sliding_window"] = 31;  // seq_len - 1: every key a query has, so full attention
  accepted(c, mistral);
  accepted(c, with("pretraining_tp", 2));
  accepted(c, with("partial_rotary_factor", 1.0));
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "initializer_range",
                        "use_cache", "temperature", "output_hidden_states"})
    accepted(c, with(k, 1));

  // Qwen2: the window counts only with use_sliding_window.
  const Config qc = config_of(kLlama, {"model.attn_bias=qkv"});
  json::Value q = hf_config(qc, "float32");
  q["sliding_window"] = 16;
  q["max_window_layers"] = 1;
  accepted(qc, q);
  q["use_sliding_window"] = true;
  refused(qc, q, {"use_sliding_window=true", "per-layer sliding window"});
  q["use_sliding_window"] = false;
  q["attention_bias"] = true;  // not a Qwen2 key
  refused(qc, q, {"attention_bias=true", "not known to this trainer for Qwen2ForCausalLM"});

  // GPT-2's attention variants.
  const Config gc = config_of("{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 64}");
  json::Value g = hf_config(gc, "float32");
  g["scale_attn_by_inverse_layer_idx"] = true;
  refused(gc, g, {"scale_attn_by_inverse_layer_idx=true"});
  g = hf_config(gc, "float32");
  g["scale_attn_weights"] = false;
  refused(gc, g, {"scale_attn_weights=false"});
  g = hf_config(gc, "float32");
  g["resid_pdrop"] = 0.1;
  const HfConfigReview gr = review_hf_config(gc, g);
  CHECK(gr.problems.empty());
  REQUIRE(gr.notes.size() == 1);
  CHECK(gr.notes[0].find("resid_pdrop=0.1 in config.json: this trainer applies no dropout") != std::string::npos);
}

TEST_CASE("config.json: rope_scaling and attention_bias are compared with the model keys", "[hf]") {
  const Config c = config_of(kLlama, {"model.rope_scaling.type=llama3", "model.rope_scaling.factor=8",
                                      "model.rope_scaling.original_max_seq_len=8192"});
  json::Value j = hf_config(c, "float32");
  // "type" is the older spelling of "rope_type".
  json::Value old = j;
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "llama3";
  accepted(c, old);
  j["rope_scaling"]["factor"] = 32.0;
  refused(c, j, {"rope_scaling={\"rope_type\":\"llama3\",\"factor\":32.0", "model.rope_scaling = ",
                 "\"factor\":8.0", "model.rope_scaling.type=llama3"});
  j = hf_config(c, "float32");
  j.erase("rope_scaling");  // absent: none
  refused(c, j, {"rope_scaling=null in config.json"});
  j = hf_config(c, "float32");
  j["rope_scaling"].erase("original_max_position_embeddings");
  refused(c, j, {"needs a number \"original_max_position_embeddings\""});

  const Config plain = config_of(kLlama);
  json::Value b = hf_config(plain, "float32");
  b["attention_bias"] = true;
  refused(plain, b, {"attention_bias=true in config.json, model.attn_bias = none"});
  json::Value l = hf_config(plain, "float32");
  l["architectures"] = json::Value::array({"Qwen2ForCausalLM"});
  refused(plain, l, {"architectures=[\"Qwen2ForCausalLM\"]", "model.attn_bias=none", "is a LlamaForCausalLM"});
}

TEST_CASE("Llama q/k/v/o and Qwen2 q/k/v bias tensors map to Hugging Face names and back", "[hf]") {
  for (const char* bias : {"qkvo", "qkv"}) {
    const Config c = config_of(kLlama, {std::string("model.attn_bias=") + bias});
    TensorMap ours;
    float next = 0;
    for (const ParamInfo& p : parameter_list(make_dims(c, 1, 1), 0.02)) {
      HostTensor t;
      t.shape = p.spec.shape;
      t.data.resize(size_t(p.spec.numel()));
      for (float& x : t.data) x = next++;
      ours[p.spec.name] = t;
    }
    const TensorMap theirs = to_hf(c, ours);
    CHECK(theirs.count("model.layers.1.self_attn.q_proj.bias") == 1);
    CHECK(theirs.count("model.layers.1.self_attn.k_proj.bias") == 1);
    CHECK(theirs.count("model.layers.1.self_attn.v_proj.bias") == 1);
    CHECK(theirs.count("model.layers.1.self_attn.o_proj.bias") == (std::string(bias) == "qkvo" ? 1u : 0u));
    const TensorMap back = from_hf(c, theirs, "<test>");
    CHECK(back.size() == ours.size());
    for (const auto& [name, t] : ours) CHECK(back.at(name).data == t.data);

    // An older directory's saved RoPE frequencies: accepted when they are
    // the configured ones (to bf16's precision), refused when not.
    TensorMap with_buffer = theirs;
    HostTensor inv;
    inv.shape = {c.head_dim() / 2};
    for (double f : ops::rope_inv_freqs(c.head_dim(), rope_of(c.model))) inv.data.push_back(float(f * (1 + 3e-3)));
    with_buffer["model.layers.0.self_attn.rotary_emb.inv_freq"] = inv;
    CHECK(from_hf(c, with_buffer, "<test>").size() == ours.size());
    for (float& f : inv.data) f /= 2;  // a linear x2 scaling config.json does not state
    with_buffer["model.layers.0.self_attn.rotary_emb.inv_freq"] = inv;
    REQUIRE_THROWS_WITH(from_hf(c, with_buffer, "<test>"),
                        Catch::Contains("model.layers.0.self_attn.rotary_emb.inv_freq [4] holds RoPE frequencies"));
  }
}

TEST_CASE("router_aux_loss_coef of model.init_from fills model.moe.aux_loss_coeff unless the configuration sets it",
          "[hf]") {
  test::TempDir dir("hf", "aux");
  const std::string moe = "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 64, "
                          "moe: {num_experts: 4, top_k: 2}}";
  Config c = config_of(moe, {"model.init_from=" + dir.path.string()});
  json::Value hf = hf_config(c, "float32");
  hf["router_aux_loss_coef"] = 0.02;
  std::ofstream(dir / "config.json") << json::dump(hf);
  const double before = c.model.moe.aux_loss_coeff;
  const std::vector<std::string> lines = adopt_init_from_settings(c);
  std::printf("[aux] %s", joined(lines).c_str());
  CHECK(before == 0.01);
  CHECK(c.model.moe.aux_loss_coeff == 0.02);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find(" model.moe.aux_loss_coeff=0.02") != std::string::npos);
  CHECK(review_hf_config(c, hf).notes.empty());

  Config set = config_of(moe, {"model.init_from=" + dir.path.string(), "model.moe.aux_loss_coeff=0.05"});
  CHECK(joined(adopt_init_from_settings(set)).find("aux_loss_coeff") == std::string::npos);
  CHECK(set.model.moe.aux_loss_coeff == 0.05);
  const HfConfigReview r = review_hf_config(set, hf);
  CHECK(r.problems.empty());
  REQUIRE(r.notes.size() == 1);
  std::printf("[aux] %s\n", r.notes[0].c_str());
  CHECK(r.notes[0].find("model.moe.aux_loss_coeff=0.05 (set in the configuration) wins over router_aux_loss_coef=0.02") !=
        std::string::npos);
}

TEST_CASE("model.init_from alone: every model key the configuration leaves unset comes from config.json",
          "[hf][init_from]") {
  test::TempDir dir("hf", "adopt");
  // The directory's model: sizes, GQA, llama3 RoPE, qkvo biases, untied, all unlike the defaults.
  const Config theirs = config_of(
      "{arch: llama, vocab_size: 100, d_model: 48, n_layers: 3, n_heads: 6, n_kv_heads: 2, d_ff: 96, "
      "max_seq_len: 128, norm_eps: 1.0e-6, rope_theta: 500000.0, attn_bias: qkvo, "
      "rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
      "original_max_seq_len: 64}}");
  std::ofstream(dir / "config.json") << json::dump(hf_config(theirs, "float32"));
  std::vector<std::string> lines;
  const auto adopt = [&](Config& c) { lines = adopt_init_from_settings(c); };
  const std::string yaml = "model: {init_from: " + dir.path.string() + "}\ntrain: {seq_len: 32}\ndata: {train: [x.bin]}\n";
  const Config c = load_config_text(yaml, "<test>", {}, 1, adopt);
  std::printf("[adopt] %s", joined(lines).c_str());
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].find("the keys the configuration leaves unset: model.arch=llama model.vocab_size=100") !=
        std::string::npos);
  const ModelConfig& m = c.model;
  CHECK(m.vocab_size == 100);
  CHECK(m.d_model == 48);
  CHECK(m.n_layers == 3);
  CHECK(m.n_heads == 6);
  CHECK(c.kv_heads() == 2);
  CHECK(c.d_ff() == 96);
  CHECK(m.max_seq_len == 128);
  CHECK(m.norm_eps == 1e-6);
  CHECK(m.rope_theta == 500000.0);
  CHECK(m.attn_bias == "qkvo");
  CHECK(m.rope_scaling.type == "llama3");
  CHECK(m.rope_scaling.factor == 8.0);
  CHECK(m.rope_scaling.original_max_seq_len == 64);
  CHECK(!m.tied());
  // What was adopted is exactly the directory's model: the review finds nothing.
  const HfConfigReview r = review_hf_config(c, hf_config(theirs, "float32"));
  std::printf("[adopt] review: %zu problems\n", r.problems.size());
  CHECK(r.problems.empty());

  // A key the configuration writes wins the adoption and is compared as before: a difference is refused.
  const std::string with_d = "model: {init_from: " + dir.path.string() + ", d_model: 60}\ntrain: {seq_len: 32}\n"
                             "data: {train: [x.bin]}\n";
  const Config c2 = load_config_text(with_d, "<test>", {}, 1, adopt);
  CHECK(c2.model.d_model == 60);
  CHECK(lines[0].find("model.d_model") == std::string::npos);
  const HfConfigReview r2 = review_hf_config(c2, hf_config(theirs, "float32"));
  REQUIRE(!r2.problems.empty());
  std::printf("[adopt] %s\n", r2.problems[0].c_str());
  CHECK(joined(r2.problems).find("hidden_size=48 in config.json, model.d_model = 60") != std::string::npos);

  // A gpt2 directory: learned positions, tied embeddings, n_inner null.
  test::TempDir gdir("hf", "adopt_gpt2");
  const Config g = config_of("{arch: gpt2, vocab_size: 80, d_model: 32, n_layers: 2, n_heads: 2, max_seq_len: 48}");
  json::Value gj = hf_config(g, "float32");
  gj["n_inner"] = nullptr;
  std::ofstream(gdir / "config.json") << json::dump(gj);
  const Config gc = load_config_text("model: {init_from: " + gdir.path.string() + "}\ntrain: {seq_len: 32}\n"
                                     "data: {train: [x.bin]}\n", "<test>", {}, 1, adopt);
  std::printf("[adopt] %s", joined(lines).c_str());
  CHECK(gc.model.arch == "gpt2");
  CHECK(gc.model.tied());
  CHECK(gc.d_ff() == 128);
  CHECK(review_hf_config(gc, gj).problems.empty());
}
