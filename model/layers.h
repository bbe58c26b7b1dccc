// The sub-layers of a Transformer block with hand-written forward and
// backward. Each forward reads the residual stream and writes the next one
// (x_out = x + f(norm(x))); each backward adds f's contribution to the residual
// gradient g.dres in place and accumulates parameter gradients.
//
// Tensor parallelism: a block receives its tensor-parallel group. Heads and
// FFN columns are split (column-parallel in, row-parallel out), so the
// row-parallel output and the gradient reaching the norm are partial sums
// over the group (sum_over_tp); a group of one sums nothing. A row-parallel
// bias is added by tp rank 0 only, so the sum adds it once.
//
// Each backward computes the input gradients first (the chain towards the
// residual stream), then the weight gradients from the same gradients, then
// the norm's backward, which adds into g.dres: the weight part is a separate
// set of calls that a pipeline schedule can later move.
#pragma once

#include "comm/communicator.h"
#include "model/activations.h"
#include "model/dims.h"
#include "model/params.h"

namespace trainer {

// RMSNorm for llama, LayerNorm for gpt2 (mean is empty for RMSNorm).
void norm_forward(const ModelDims& d, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w,
                  Tensor b);
void norm_backward(const ModelDims& d, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x,
                   Tensor w, Tensor mean, Tensor rstd);

// In place over the tensor-parallel group (nothing for a group of one).
void sum_over_tp(Communicator& tp, Tensor t);

void attention_block_forward(const ModelDims& d, Communicator& tp, const LayerWeights& w, LayerActs& a, Tensor x_out);
void attention_block_backward(const ModelDims& d, Communicator& tp, const LayerWeights& w, const LayerWeights& gw,
                              const LayerActs& a, GradScratch& g);

void mlp_block_forward(const ModelDims& d, Communicator& tp, const LayerWeights& w, LayerActs& a, Tensor x_out);
void mlp_block_backward(const ModelDims& d, Communicator& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g);

// moe_out is a [N,C] combine buffer shared by all MoE layers.
void moe_block_forward(const ModelDims& d, Communicator& tp, const LayerWeights& w, LayerActs& a, Tensor moe_out,
                       Tensor x_out);
// aux_grad: d loss / d aux of this layer.
void moe_block_backward(const ModelDims& d, Communicator& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, float aux_grad);

}  // namespace trainer
