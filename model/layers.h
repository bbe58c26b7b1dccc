// The sub-layers of a Transformer block with hand-written forward and
// backward. Each forward reads the residual stream and writes the next one
// (x_out = x + f(norm(x))); each backward adds f's contribution to the residual
// gradient g.dres in place and accumulates parameter gradients.
#pragma once

#include "model/activations.h"
#include "model/dims.h"
#include "model/params.h"

namespace trainer {

// RMSNorm for llama, LayerNorm for gpt2 (mean is empty for RMSNorm).
void norm_forward(const ModelDims& d, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w,
                  Tensor b);
void norm_backward(const ModelDims& d, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x,
                   Tensor w, Tensor mean, Tensor rstd);

void attention_block_forward(const ModelDims& d, const LayerWeights& w, LayerActs& a, Tensor x_out);
void attention_block_backward(const ModelDims& d, const LayerWeights& w, const LayerWeights& gw,
                              const LayerActs& a, GradScratch& g);

void mlp_block_forward(const ModelDims& d, const LayerWeights& w, LayerActs& a, Tensor x_out);
void mlp_block_backward(const ModelDims& d, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g);

// moe_out is a [N,C] combine buffer shared by all MoE layers.
void moe_block_forward(const ModelDims& d, const LayerWeights& w, LayerActs& a, Tensor moe_out,
                       Tensor x_out);
// aux_grad: d loss / d aux of this layer.
void moe_block_backward(const ModelDims& d, const LayerWeights& w, const LayerWeights& gw,
                        const LayerActs& a, GradScratch& g, float aux_grad);

}  // namespace trainer
