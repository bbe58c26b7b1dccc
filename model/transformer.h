// The whole decoder-only model: embedding, L blocks (attention + dense or MoE
// FFN), final norm, head and fused cross-entropy. Holds the buffers of one
// model replica; the math lives in the block files and kernels/ops.h.
#pragma once

#include <vector>

#include "kernels/arena.h"
#include "model/activations.h"
#include "model/dims.h"
#include "model/params.h"

namespace trainer {

struct Model {
  ModelDims dims;
  std::vector<ParamInfo> params;
  Arena param_arena, grad_arena, act_arena, scratch_arena;
  std::vector<Tensor> param_tensors, grad_tensors;
  Weights w, gw;
  Activations acts;
  GradScratch g;
};

void build_model(Model& m, const ModelDims& d, double init_std, Device device);

struct ForwardResult {
  double loss_sum = 0;   // sum over the micro-batch's tokens of the cross-entropy
  double aux_sum = 0;    // sum over MoE layers of the load-balancing loss
};

// Reads m.acts.ids / m.acts.targets. With ce_grad_scale > 0 the logits are
// overwritten with their gradient (scaled), ready for model_backward.
ForwardResult model_forward(Model& m, float ce_grad_scale);
// Accumulates parameter gradients into m.gw. aux_grad = d loss / d aux (per layer).
void model_backward(Model& m, float aux_grad);
void zero_grads(Model& m);

}  // namespace trainer
