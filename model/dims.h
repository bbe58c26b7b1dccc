// The sizes one model instance computes with, resolved from the config once.
// Layers read only these, so tensor/expert parallelism later shrinks the local
// counts (heads, ffn columns, experts per rank) without touching layer code.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/tensor.h"

#include "config/config.h"
#include "kernels/rope_freqs.h"

namespace trainer {

// Activation recompute (model/recompute.h): what a layer keeps for its
// backward and what the backward recomputes from it.
enum class Recompute { None, Selective, Full };

struct ModelDims {
  bool llama = true;       // false: gpt2 (LayerNorm, GELU, biases, learned positions)
  bool tied = false;
  int64_t B = 1, T = 1;    // micro-batch, sequence
  int64_t C = 0, V = 0, L = 0;
  int64_t Hq = 0, Hkv = 0, D = 0, F = 0;
  int64_t max_seq = 0;
  int64_t E = 0, K = 0, Fm = 0, moe_every = 1;  // E: experts of the model (the router's width)
  int64_t E_local = 0;     // experts whose weights this instance holds (expert parallelism; 0: E)
  int ep = 1;              // expert-parallel group size: E / E_local
  // Rows per expert of a micro-batch's whole sequences (B x T x cp tokens),
  // 0: dropless. Under cp the ranks admit over the whole sequences together
  // (model/moe_routing_plan.h); under ep each source rank keeps its own.
  int64_t capacity = 0;
  bool normalize_topk = true;
  float eps = 1e-5f;
  ops::Rope rope;          // llama: RoPE's base and scaling
  // Attention projection biases: q, k, v (gpt2; llama with model.attn_bias
  // qkv or qkvo) and o (gpt2; llama qkvo).
  bool qkv_bias = false, o_bias = false;
  // Sliding-window attention (model.sliding_window): a query at global
  // position i sees keys at positions i - window .. i; 0: all of 0 .. i.
  int64_t window = 0;
  // Separate documents (data.documents: separate): each micro-batch says
  // where every token's document starts (Activations::doc_start); positions
  // restart there and attention does not look past it.
  bool documents = false;
  float aux_coeff = 0.f;
  // Storage type of weights, their gradients and activations (F32 on the CPU;
  // BF16/F16 under mixed precision on a GPU). Statistics stay F32.
  DType act = DType::F32;
  // Pipeline stage: this instance holds layers [first_layer, first_layer + L)
  // of a model of model_layers layers (0: L), the embedding when it is the
  // first stage and the head when it is the last. One process: all of it.
  int64_t first_layer = 0, model_layers = 0;
  bool has_embedding = true, has_head = true;
  // Tensor parallelism (model/tensor_parallel.h): tp ranks split heads, FFN
  // columns and the vocabulary. The vocabulary is padded to a multiple of
  // tp: this instance holds vocabulary rows [V_offset, V_offset + V), of
  // which the ids below vocab_size are real (rows past it are padding that
  // no id reaches and no logit counts). With sp the residual stream, norms
  // and residual adds hold only this rank's N / tp token rows.
  int tp = 1;
  bool sp = false;
  // Context parallelism (model/context_parallel.h): T is this rank's tokens
  // of each sequence (two zigzag chunks of the whole T_global = T x cp).
  int cp = 1, cp_rank = 0;
  int64_t vocab_size = 0;  // the model's real vocabulary (0: V)
  int64_t V_offset = 0;
  // The pipeline schedule splits each backward into its input half and its
  // weight half (ZB-H1): each micro-batch's activation slot also keeps the
  // output gradients the weight half reads (model/activations.h).
  bool split_backward = false;
  // Activation recompute of the first recompute_layers local layers (0: all).
  Recompute recompute = Recompute::None;
  int64_t recompute_layers = 0;
  int64_t N() const { return B * T; }
  // Query-key pairs per sequence and head that the causal mask (and the
  // window) let through, in the continuous count the FLOP estimates use:
  // T^2 / 2 for causal attention of T = T_global tokens, the band
  // T^2/2 - (T - W)^2/2 with a window W < T.
  double attended_pairs(int64_t T_global) const {
    const double t = double(T_global), w = double(window);
    return window > 0 && window < T_global ? t * t / 2 - (t - w) * (t - w) / 2 : t * t / 2;
  }
  // Token rows of the residual stream on this rank (N / tp under sp).
  int64_t rows() const { return sp ? N() / tp : N(); }
  int64_t vocab() const { return vocab_size > 0 ? vocab_size : V; }
  // Real (non-padding) vocabulary rows this instance holds.
  int64_t V_valid() const {
    const int64_t v = vocab() - V_offset;
    return v < 0 ? 0 : (v < V ? v : V);
  }
  int64_t layers_total() const { return model_layers > 0 ? model_layers : L; }
  int64_t experts_here() const { return E_local > 0 ? E_local : E; }
  // Rows the experts of this rank may receive in one MoE layer: its own N K
  // dispatched rows without expert parallelism; under it every ep rank's
  // rows for these experts, at most ep N K (all routed here) or, with a
  // capacity, E x capacity (each source keeps at most `capacity` rows per
  // expert).
  int64_t expert_rows() const {
    const int64_t NK = N() * K;
    if (ep <= 1) return NK;
    return capacity > 0 ? std::min<int64_t>(int64_t(ep) * NK, E * capacity) : int64_t(ep) * NK;
  }
  // What local layer i recomputes in its backward.
  Recompute recompute_of(int64_t i) const {
    return recompute_layers == 0 || i < recompute_layers ? recompute : Recompute::None;
  }
  // i counts this instance's layers; MoE placement follows the global index.
  bool moe_layer(int64_t i) const { return E > 0 && (first_layer + i + 1) % moe_every == 0; }
};

// RoPE as model.rope_theta and model.rope_scaling describe it.
ops::Rope rope_of(const ModelConfig& m);

ModelDims make_dims(const Config& c, int64_t micro_batch, int64_t seq_len, DType storage = DType::F32);

}  // namespace trainer
