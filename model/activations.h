// Buffers one micro-batch needs: what forward saves for backward, and the
// gradient scratch backward reuses layer after layer. The list is the single
// source for the memory plan and for the allocation.
#pragma once

#include <vector>

#include "core/arena.h"
#include "model/dims.h"

namespace trainer {

// The output gradients a layer's weight gradients are computed from. A
// schedule that splits the backward (ModelDims::split_backward) keeps them
// in the micro-batch's slot from the input half (BI) to the weight half
// (BW); a whole backward points them at the gradient scratch.
struct WeightGradInputs {
  Tensor attn_dy, dq, dk, dv;      // attention: d out (whole sequence), d q / k / v after RoPE's backward
  Tensor mlp_dy, d1, d2;           // dense FFN: d out, d gate (gpt2: fc) and d up pre-activations
  Tensor dyp, de1, de2, drlogits;  // MoE: d expert outputs and pre-activations (the experts' rows), d router logits
};

// Which part of a backward runs: all of it, or the input half of a split
// backward (the weight half has its own functions).
enum class BackwardPart { Whole, Input };

struct LayerActs {
  // [N,C] tensors of the residual stream and the norm outputs h1, h2 hold
  // this rank's rows only under sequence parallelism ([N/tp, C]); see
  // model/tensor_parallel.h.
  Tensor x_in;                 // residual entering the layer [N,C]
  Tensor h1, mean1, rstd1;     // attention norm out, stats
  Tensor q, k, v;              // after bias and RoPE: [B,T,H,D]
  Tensor o, lse;               // attention out [N,Hq*D], lse [B,Hq,T]
  Tensor x_mid;                // residual after attention [N,C]
  Tensor h2, mean2, rstd2;     // mlp norm out, stats
  Tensor a1, a2, act;          // dense: llama gate/up/swiglu; gpt2 fc/-/gelu  [N,F]
  // MoE
  // router_stats [2, E]: the micro-batch's tokens per expert and summed
  // probabilities (whole sequences: model/moe_routing_plan.h).
  Tensor rlogits, probs, topk_idx, topk_w, router_stats, row_map, offsets, aux;
  Tensor xp, e1, e2, eact, yp; // permuted rows [N*K, C|Fm]; e1, e2, eact on the experts' side [R, Fm]
  // Expert parallelism (model/expert_parallel.h): the rows this rank's
  // experts received from every ep rank [R, C] (R = ModelDims::expert_rows),
  // their outputs before they go back, every ep rank's dispatch offsets
  // [ep, E+1] and the received rows' per-source expert offsets [ep, E_local+1].
  // Without it xe is xp and ye is yp.
  Tensor xe, ye, ep_gather, ep_offsets;
  std::vector<int64_t> ep_send, ep_recv;  // rows to / from each ep rank (host)
  WeightGradInputs stash;      // split backward only
  // Separate documents: the micro-batch's Activations::doc_start and the
  // positions RoPE turns by (tok_pos; gpt2: pos_ids), the same for every layer.
  Tensor doc_start, tok_pos;
};

struct Activations {
  Tensor ids, targets, pos_ids;          // [N] I32
  // Separate documents only ([N] I32, written with each micro-batch): the
  // position in the whole sequence where each local token's document starts,
  // and the token's position inside its document (llama; gpt2 writes pos_ids).
  Tensor doc_start, tok_pos;
  std::vector<LayerActs> layers;
  Tensor x_final, hf, meanf, rstdf;      // [N,C]
  Tensor logits;                         // [N,V], overwritten with its gradient
  Tensor losses;                         // [N]
  Tensor moe_out;                        // [N,C] combine buffer
};

// Backward scratch, shared by all layers (overwritten layer by layer).
struct GradScratch {
  Tensor dres;                 // gradient of the residual stream [N,C]: the micro-batch's slot dx
  Tensor dh;                   // gradient of a norm output [N,C]
  Tensor tp_full;              // sequence parallelism: whole-sequence scratch [N,C] (forward too)
  Tensor tp_gathered;          // sequence parallelism: a norm output's whole sequence [N,C]
  Tensor ce_stats;             // tp > 1: [tp, N, 3] F32 cross-entropy statistics of every vocabulary shard
  Tensor dq, dk, dv, dout;     // [N, H*D]
  Tensor d1, d2, dact;         // [N,F]
  Tensor drlogits, dtopk_w;    // [N,E], [N,K]
  Tensor dxp, dxp2, dyp;       // [N*K, C]
  Tensor de1, de2, deact;      // [R, Fm] (the experts' rows)
  Tensor dye, dxe, dxe2;       // expert parallelism: the experts' rows [R, C]; else dyp, dxp, dxp2
  // Context parallelism (model/context_parallel.h): every cp rank's token
  // positions [cp, T] (written once), the ring's received key/value blocks
  // and their gradients [B, T, Hkv, D] (two each), one block's partial
  // attention output and log-sum-exp.
  Tensor cp_positions, cp_k0, cp_k1, cp_v0, cp_v1, cp_dk0, cp_dk1, cp_dv0, cp_dv1, cp_o, cp_lse;
  // A MoE capacity admitted over the cp group's whole sequences (ContextParallel).
  Tensor cp_moe_all_rows, cp_moe_all_idx, cp_moe_all_offsets, cp_moe_admitted;
  // Activation recompute (model/recompute.h): the one copy of what
  // recomputing layers leave out of their slots.
  LayerActs recompute;
};

std::vector<TensorSpec> activation_specs(const ModelDims& d);
std::vector<TensorSpec> grad_scratch_specs(const ModelDims& d);
// shared: GradScratch::recompute, which recomputing layers point at for the
// fields they leave out of the slot.
Activations bind_activations(const ModelDims& d, const std::vector<TensorSpec>& specs,
                             const std::vector<Tensor>& tensors, const LayerActs& shared = {});
GradScratch bind_grad_scratch(const std::vector<TensorSpec>& specs,
                              const std::vector<Tensor>& tensors);

}  // namespace trainer
