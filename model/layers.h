// The sub-layers of a Transformer block with hand-written forward and
// backward. Each forward reads the residual stream and writes the next one
// (x_out = x + f(norm(x))); each backward adds f's contribution to the residual
// gradient g.dres in place and accumulates parameter gradients.
//
// Tensor parallelism (model/tensor_parallel.h): a block receives its
// tensor-parallel group. Heads and FFN columns are split (column-parallel
// in, row-parallel out), and the communication regions sum the row-parallel
// output and the gradient reaching the norm over the group; a group of one
// sums nothing. A row-parallel bias is added by tp rank 0 only, before the
// sum, so it is added once. Under sequence parallelism the residual stream
// (x_in, x_mid, the block output, g.dres) and the saved norm outputs h1 / h2
// hold this rank's token rows only; the column-parallel linears read them
// gathered (in backward gathered again, by the weight-gradient half).
//
// Each backward computes the input gradients first (the chain towards the
// residual stream), then the weight gradients from the same gradients, then
// the norm's backward, which adds into g.dres. A split backward (zero-bubble
// schedules) runs BackwardPart::Input, which leaves the linears' output
// gradients in the slot (LayerActs::stash), and later *_backward_weight,
// which computes the matrix (and bias) gradients from them. The norms'
// weight gradients come with the input half: their kernel computes both in
// one pass over the rows, and they are C numbers per layer, not a matmul.
#pragma once

#include "model/activations.h"
#include "model/context_parallel.h"
#include "model/dims.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace trainer {

// RMSNorm for llama, LayerNorm for gpt2 (mean is empty for RMSNorm).
void norm_forward(const ModelDims& d, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w,
                  Tensor b);
void norm_backward(const ModelDims& d, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x,
                   Tensor w, Tensor mean, Tensor rstd);

// cp: the context-parallel ring (a group of one: plain attention).
void attention_block_forward(const ModelDims& d, const TensorParallel& tp, const ContextParallel& cp,
                             const LayerWeights& w, LayerActs& a, Tensor x_out);
void attention_block_backward(const ModelDims& d, const TensorParallel& tp, const ContextParallel& cp,
                              const LayerWeights& w, const LayerWeights& gw, const LayerActs& a, GradScratch& g,
                              BackwardPart part = BackwardPart::Whole);
void attention_block_backward_weight(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w,
                                     const LayerWeights& gw, const LayerActs& a, const WeightGradInputs& in);

void mlp_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a, Tensor x_out);
void mlp_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, BackwardPart part = BackwardPart::Whole);
void mlp_block_backward_weight(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w,
                               const LayerWeights& gw, const LayerActs& a, const WeightGradInputs& in);

// moe_out is a [N,C] combine buffer shared by all MoE layers.
// cp: the group splitting the sequences, over which the router statistics
// and the capacity's admission are whole (model/moe_routing_plan.h).
// ep: the expert-parallel group (a group of one without expert parallelism).
void moe_block_forward(const ModelDims& d, const TensorParallel& tp, const ContextParallel& cp, Communicator& ep,
                       const LayerWeights& w, LayerActs& a, Tensor moe_out, Tensor x_out);
// aux_grad: d loss / d aux of this layer.
void moe_block_backward(const ModelDims& d, const TensorParallel& tp, Communicator& ep, const LayerWeights& w,
                        const LayerWeights& gw, const LayerActs& a, GradScratch& g, float aux_grad,
                        BackwardPart part = BackwardPart::Whole);
void moe_block_backward_weight(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w,
                               const LayerWeights& gw, const LayerActs& a, const WeightGradInputs& in);

}  // namespace trainer
