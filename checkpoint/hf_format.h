// Hugging Face model directories: which architecture a model configuration
// maps to (LlamaForCausalLM, MistralForCausalLM: a llama with
// model.sliding_window, GPT2LMHeadModel, MixtralForCausalLM), its
// config.json, and the tensor names and conventions in both directions.
// One rule list serves export and import, so the two cannot drift apart.
//
// Conventions that differ from ours (docs/MODEL_MATH.md has ours):
//  - GPT-2 stores its linears as Conv1D, [in, out] (ours [out, in]), and the
//    query, key and value projections fused into one c_attn [C, 3C];
//  - Mixtral stores each expert as its own three matrices (w1 gate, w3 up,
//    w2 down), ours one [E, ...] tensor per kind;
//  - the same RoPE (half-split pairs, rotate_half), RMSNorm (x * rsqrt(mean
//    x^2 + eps) * w), GELU (tanh approximation: "gelu_new") and top-k
//    softmax routing renormalised over the chosen experts.
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
// window), "GPT2LMHeadModel" or "MixtralForCausalLM"; throws ConfigError
// saying why when the configuration has no Hugging Face twin (gpt2 with
// grouped-query attention or a sliding window, a GPT-2-style MoE, MoE on only
// some layers, top-k weights not renormalised).
std::string hf_architecture(const Config& c);

// config.json for the model of `c`; torch_dtype "float32" or "bfloat16".
json::Value hf_config(const Config& c, const std::string& torch_dtype);

// Every difference between a config.json and the model configuration,
// one line each naming both keys ("hidden_size=64 in config.json, model.d_model=32"); empty: they agree.
// LlamaForCausalLM and MistralForCausalLM are interchangeable (the same
// tensors) as long as their sliding windows mask the same keys at
// train.seq_len: Mistral's and Mixtral's `sliding_window` (absent: their
// defaults 4096 and null) against model.sliding_window, a window
// >= train.seq_len - 1 or null being full causal attention.
std::vector<std::string> hf_config_mismatches(const Config& c, const json::Value& hf);

// Our tensors (names as model/params.h, whole, one process) -> theirs.
TensorMap to_hf(const Config& c, const TensorMap& ours);
// Theirs -> ours. Throws ConfigError listing every missing tensor, every
// wrong shape and every tensor it does not know (`where`: the directory).
TensorMap from_hf(const Config& c, const TensorMap& hf, const std::string& where);

}  // namespace trainer
