// Hugging Face model directories: which architecture a model configuration
// maps to (LlamaForCausalLM, MistralForCausalLM: a llama with
// model.sliding_window, Qwen2ForCausalLM, GPT2LMHeadModel, MixtralForCausalLM),
// its config.json, and the tensor names and conventions in both directions
// (interop/hf_config_check.h reads a config.json).
// One rule list serves export and import, so the two cannot drift apart.
//
// Conventions that differ from ours (docs/MODEL_MATH.md has ours):
//  - GPT-2 stores its linears as Conv1D, [in, out] (ours [out, in]), and the
//    query, key and value projections fused into one c_attn [C, 3C];
//  - Mixtral stores each expert as its own three matrices (w1 gate, w3 up,
//    w2 down), ours one [E, ...] tensor per kind;
//  - Qwen2 is Llama with biases on q, k and v (not o): our llama with
//    model.attn_bias qkv; Llama's attention_bias: true puts them on o too
//    (model.attn_bias qkvo);
//  - the same RoPE (half-split pairs, rotate_half; "rope_scaling" linear and
//    llama3 as kernels/rope_freqs.h), RMSNorm (x * rsqrt(mean x^2 + eps) *
//    w), GELU (tanh approximation: "gelu_new") and top-k softmax routing
//    renormalised over the chosen experts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/strict_json.h"
#include "config/config.h"

namespace trainer {

// A whole tensor on the host, fp32.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  int64_t numel() const;
};
using TensorMap = std::map<std::string, HostTensor>;

// "LlamaForCausalLM", "MistralForCausalLM" (dense llama with a sliding
// window), "Qwen2ForCausalLM" (llama with model.attn_bias qkv),
// "GPT2LMHeadModel" or "MixtralForCausalLM"; throws ConfigError saying why
// when the configuration has no Hugging Face twin (gpt2 with grouped-query
// attention or a sliding window, a GPT-2-style MoE, MoE on only some layers,
// top-k weights not renormalised, MoE with attention biases, attention
// biases with a sliding window).
std::string hf_architecture(const Config& c);
// config.json's "model_type" of an architecture: llama, qwen2, gpt2, mixtral.
std::string hf_model_type(const std::string& arch);
// config.json's "rope_scaling": null, {"type": "linear", "factor"} or
// {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
// "original_max_position_embeddings"}.
json::Value hf_rope_scaling(const RopeScalingConfig& s);

// config.json for the model of `c`; torch_dtype "float32" or "bfloat16".
json::Value hf_config(const Config& c, const std::string& torch_dtype);

// Our tensors (names as model/params.h, whole, one process) -> theirs.
TensorMap to_hf(const Config& c, const TensorMap& ours);
// Theirs -> ours. Throws ConfigError listing every missing tensor, every
// wrong shape and every tensor it does not know (`where`: the directory).
TensorMap from_hf(const Config& c, const TensorMap& hf, const std::string& where);

}  // namespace trainer
