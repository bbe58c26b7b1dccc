// The one FLOP count of the code base: the planner's compute time
// (planner/step_estimate.h), the pipeline's stage balance
// (pipeline/stage_split.h), and the model FLOPs behind every MFU (a run's,
// observe/step_time.h, and the planner's) all come from these functions, so
// the MFU a plan predicts and the MFU a run measures count the same work.
//
// Conventions (docs/PLANNING.md "Time"):
// - A matmul of an [n, k] input by a [k, m] weight is 2 n k m FLOPs; only
//   weights of matrix multiplications count (projections, FFN, the router,
//   the experts a token visits, the head). Embedding lookups, norms, biases
//   and element-wise work are no matmuls.
// - Causal attention counts HALF of the T x T work: QK^T and PV over the
//   scores a causal mask keeps, 2 B Hq T^2 D per layer forward (a causal
//   kernel skips the rest; PaLM's appendix B counts all of it); under a
//   sliding window only the band's pairs (ModelDims::attended_pairs).
// - Backward = 2 x forward, so a trained token costs 3 x its forward.
#pragma once

#include <cstdint>

#include "model/dims.h"

namespace trainer {

// Forward FLOPs of one micro-batch (dims' B x T tokens) of the whole model
// (not divided by tp or cp, which divide every piece alike).
double attention_core_flops(const ModelDims& d);                // one layer's causal QK^T and PV
double layer_matmul_flops(const ModelDims& d, int64_t layer);   // q, k, v, o, FFN or router + top-k experts
double head_matmul_flops(const ModelDims& d);                   // the output projection to the vocabulary

// Model FLOPs per trained token, forward and backward: 3 x (the layers'
// matmuls and causal attention + the head) / tokens. For a dense model
// this is 6 N + 6 L T C (N: matmul weights; half of PaLM's 12 L T C).
// The numerator of every MFU.
double flops_per_token(const ModelDims& global);

}  // namespace trainer
