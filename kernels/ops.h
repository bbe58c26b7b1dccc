// The op set: backend-neutral functions on Tensor views. Model code calls only
// these. Every op is declared once, in kernels/op_list.h (signature, routing
// rule, doc comment); this header turns that list into the declarations of
// trainer::ops. ops.cpp routes each call to kernels/cpu (the fp32 reference)
// or, when the tensors live on a GPU, to kernels/cuda.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/rope_freqs.h"

namespace trainer::ops {

// One AdamW step's constants (adamw_update, adamw_update_master, and
// adamw_update_master_multi, which takes the weight decay per tensor).
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;        // 1-based, for bias correction
  float grad_scale;    // gradient is multiplied by this first (clipping, unscaling)
};

#define TRAINER_OP(route, ret, name, params, args) ret name params;
#include "kernels/op_list.h"
#undef TRAINER_OP

}  // namespace trainer::ops
