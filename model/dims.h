// The sizes one model instance computes with, resolved from the config once.
// Layers read only these, so tensor/expert parallelism later shrinks the local
// counts (heads, ffn columns, experts per rank) without touching layer code.
#pragma once

#include <cstdint>

#include "core/tensor.h"

#include "config/config.h"

namespace trainer {

struct ModelDims {
  bool llama = true;       // false: gpt2 (LayerNorm, GELU, biases, learned positions)
  bool tied = false;
  int64_t B = 1, T = 1;    // micro-batch, sequence
  int64_t C = 0, V = 0, L = 0;
  int64_t Hq = 0, Hkv = 0, D = 0, F = 0;
  int64_t max_seq = 0;
  int64_t E = 0, K = 0, Fm = 0, moe_every = 1;
  int64_t capacity = 0;    // per expert rows, 0: dropless
  bool normalize_topk = true;
  float eps = 1e-5f, rope_theta = 10000.f;
  float aux_coeff = 0.f;
  // Storage type of weights, their gradients and activations (F32 on the CPU;
  // BF16/F16 under mixed precision on a GPU). Statistics stay F32.
  DType act = DType::F32;
  int64_t N() const { return B * T; }
  bool moe_layer(int64_t i) const { return E > 0 && (i + 1) % moe_every == 0; }
};

ModelDims make_dims(const Config& c, int64_t micro_batch, int64_t seq_len, DType storage = DType::F32);

}  // namespace trainer
