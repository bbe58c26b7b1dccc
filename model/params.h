// The parameter list of the model: names (docs/MODEL_MATH.md), shapes, how
// each tensor would be split under tensor/expert parallelism, weight decay and
// initialisation. Weights and gradients are bound to the same list, so the
// two always have identical layout.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/arena.h"
#include "model/dims.h"

namespace trainer {

// Which mesh axis cuts one dimension of a parameter: TP splits the output
// rows of column-parallel weights (wq/wk/wv, gate/up, fc, and their biases),
// the input columns of row-parallel ones (wo, down, proj) and the vocabulary
// rows of the embedding and the head; EP splits the stacked experts, inside
// which TP cuts as in a dense FFN. Everything else is whole on every rank.
enum class Cut : uint8_t { None, TP, EP };

enum class Init { Normal, Ones, Zeros };

struct ParamInfo {
  TensorSpec spec;                    // this instance's slice (local shape)
  std::vector<Cut> cuts;              // per dimension
  // Where the slice sits in the global tensor (model/sharding.h fills these;
  // parameter_list leaves global = local, offset 0). box_shape is the part of
  // the local tensor inside the global one: the local shape, except for the
  // last tensor-parallel rank of a vocabulary that tp does not divide, whose
  // trailing rows are padding (zero, never saved: see V_valid in dims.h).
  std::vector<int64_t> global_shape, offset, box_shape;
  Init init = Init::Normal;
  float init_std = 0.f;
  bool decay = true;     // norms and biases are exempt
  bool expert() const;   // cut along EP: reduced over the expert-data-parallel group
  bool tp_split() const; // some dimension is cut along TP
  int64_t box_numel() const;  // elements inside the global tensor (the rest is padding)
};

// The parameters of a model instance of dims `d` (for a pipeline stage: its
// layers, the embedding on the first stage, the head on the last, and a copy
// of a tied embedding there), in unit order (model/units.h).
std::vector<ParamInfo> parameter_list(const ModelDims& d, double init_std);
std::vector<TensorSpec> specs_of(const std::vector<ParamInfo>& params);

// Where elements [begin, begin + count) of p's local slice (row-major) sit
// in the global tensor: fn(local index, global flat index, run length) for
// each run, in order; padding elements (past the box) are left out.
void for_each_global_run(const ParamInfo& p, int64_t begin, int64_t count,
                         const std::function<void(int64_t, int64_t, int64_t)>& fn);
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

// Deterministic init: element i (row-major in the GLOBAL tensor) of a
// parameter is a pure function of (seed, name, i) (a counter-based
// SplitMix64 stream and Box-Muller), so any slice of any layout equals the
// same slice of the one-process tensor, on any device and dtype.
// Elements [begin, begin + count) of p's local slice (row-major in it):
void initial_values(const ParamInfo& p, uint64_t seed, int64_t begin, int64_t count, float* out);
std::vector<float> initial_values(const ParamInfo& p, uint64_t seed);  // the whole local slice
// Host F32 tensors only (tests, CPU runs); the engine uploads initial_values.
void init_parameters(const std::vector<ParamInfo>& params, const std::vector<Tensor>& tensors,
                     uint64_t seed);

}  // namespace trainer
