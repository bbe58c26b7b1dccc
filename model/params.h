// The parameter list of the model: names (docs/MODEL_MATH.md), shapes, how
// each tensor would be split under tensor/expert parallelism, weight decay and
// initialisation. Weights and gradients are bound to the same list, so the
// two always have identical layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/arena.h"
#include "model/dims.h"

namespace trainer {

// How tensor parallelism cuts a parameter: Column splits dim 0 (output rows:
// wq/wk/wv, gate/up, fc), Row splits the input dim (wo, down, proj), Vocab
// splits dim 0 of embeddings and the head, Expert splits dim 0 of stacked
// expert weights across the expert-parallel group.
enum class Split { Replicated, Column, Row, Vocab, Expert };
const char* split_name(Split s);

enum class Init { Normal, Ones, Zeros };

struct ParamInfo {
  TensorSpec spec;
  Split split = Split::Replicated;
  Init init = Init::Normal;
  float init_std = 0.f;
  bool decay = true;     // norms and biases are exempt
};

std::vector<ParamInfo> parameter_list(const ModelDims& d, double init_std);
std::vector<TensorSpec> specs_of(const std::vector<ParamInfo>& params);
int64_t parameter_count(const std::vector<ParamInfo>& params);

struct LayerWeights {
  Tensor attn_norm_w, attn_norm_b;
  Tensor wq, bq, wk, bk, wv, bv, wo, bo;
  Tensor mlp_norm_w, mlp_norm_b;
  // dense FFN
  Tensor w_gate, w_up, w_down;       // llama
  Tensor w_fc, b_fc, w_proj, b_proj; // gpt2
  // MoE FFN
  Tensor router;
  Tensor e_gate, e_up, e_down;       // llama experts
  Tensor e_fc, e_proj;               // gpt2 experts
};

struct Weights {
  Tensor tok_embed, pos_embed;
  std::vector<LayerWeights> layers;
  Tensor final_norm_w, final_norm_b;
  Tensor lm_head;                    // == tok_embed when tied
};

// Binds tensors (in parameter_list order) to named slots. Used for weights and
// for gradients alike.
Weights bind_weights(const ModelDims& d, const std::vector<ParamInfo>& params,
                     const std::vector<Tensor>& tensors);

// For each parameter (parameter_list order), the slots of `w` that hold it:
// one, or two for a tied embedding (tok_embed and lm_head). ZeRO-3 rebinds
// them when it gathers a unit into a buffer. The pointers stay valid while
// `w` is not resized or moved.
std::vector<std::vector<Tensor*>> weight_slots(const ModelDims& d, const std::vector<ParamInfo>& params,
                                               Weights& w);

// Deterministic init: each tensor draws from a stream seeded by (seed, name),
// so the values do not depend on the device, the dtype or the layout.
std::vector<float> initial_values(const ParamInfo& p, uint64_t seed);
// Host F32 tensors only (tests, CPU runs); the engine uploads initial_values.
void init_parameters(const std::vector<ParamInfo>& params, const std::vector<Tensor>& tensors,
                     uint64_t seed);

}  // namespace trainer
