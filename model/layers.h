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
// (x_in, x_mid, the block output, g.dres) holds this rank's token rows only,
// the norm outputs h1 / h2 the whole sequence (gathered).
//
// Each backward computes the input gradients first (the chain towards the
// residual stream), then the weight gradients from the same gradients, then
// the norm's backward, which adds into g.dres: the weight part is a separate
// set of calls that a pipeline schedule can later move.
#pragma once

#include "model/activations.h"
#include "model/dims.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace trainer {

// RMSNorm for llama, LayerNorm for gpt2 (mean is empty for RMSNorm).
void norm_forward(const ModelDims& d, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w,
                  Tensor b);
void norm_backward(const ModelDims& d, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x,
                   Tensor w, Tensor mean, Tensor rstd);

void attention_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a, Tensor x_out);
void attention_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                              const LayerActs& a, GradScratch& g);

void mlp_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a, Tensor x_out);
void mlp_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g);

// moe_out is a [N,C] combine buffer shared by all MoE layers.
void moe_block_forward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, LayerActs& a, Tensor moe_out,
                       Tensor x_out);
// aux_grad: d loss / d aux of this layer.
void moe_block_backward(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, float aux_grad);

}  // namespace trainer
