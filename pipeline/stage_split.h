// Which layers each pipeline stage holds. A stage's time is its layers'
// plus the embedding on the first stage and the head + loss on the last, so
// an even split of the layers leaves the last stage slowest whenever the
// vocabulary is large; the balanced split minimises the slowest stage under
// a cost model of forward FLOPs per micro-batch (the backward is about twice
// the forward everywhere, so it does not change the balance).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/dims.h"

namespace trainer {

// Forward FLOPs of one micro-batch (dims' B x T tokens), whole model (not
// divided by tp, which divides every piece alike): model/flops.h's count
// (causal attention at half the T x T work) plus what is no matmul but still
// takes a stage's time (the embedding gather, the cross-entropy passes).
double embedding_flops(const ModelDims& d);
double layer_flops(const ModelDims& d, int64_t layer);  // global layer index
double head_flops(const ModelDims& d);                  // final norm, head, cross-entropy

// Each stage's forward FLOPs for this split.
std::vector<double> stage_flops(const ModelDims& d, const std::vector<int64_t>& layers);

// Contiguous layer counts, every stage at least one layer, minimising the
// largest stage cost (ties: the earlier stages, which hold more in-flight
// activations under 1F1B, take fewer layers). Throws
// ConfigError when there are fewer layers than stages.
std::vector<int64_t> balanced_stage_layers(const ModelDims& d, int stages);

// "[3, 5, 5, 7]"
std::string format_layers(const std::vector<int64_t>& layers);

}  // namespace trainer
