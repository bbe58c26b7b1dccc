// The CUDA backend: the functions of kernels/op_list.h (semantics documented
// there), declared here from that list.
//
// Element types: activations, weights and their gradients may be BF16, F16 or
// F32 (storage); every kernel computes in fp32. Statistics that backward reads
// or that are reduced across tokens stay F32: rstd, mean, lse, losses, probs,
// topk_w, aux, and the AdamW master weights and moments. Index tensors
// (ids, targets, topk_idx, row_map, offsets) are I32. Every op launches on
// cuda::stream() and returns without synchronising, except those returning
// a double (sum, sum_squares), which synchronise to read the result.
#pragma once

#include "kernels/ops.h"

namespace trainer::cuda {

using ops::AdamWStep;
using ops::Rope;

#define TRAINER_OP(route, ret, name, params, args) ret name params;
#include "kernels/op_list.h"
#undef TRAINER_OP

}  // namespace trainer::cuda
