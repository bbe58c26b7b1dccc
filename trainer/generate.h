// Text from the trained model, so a person sees that it learned: sampling
// with temperature from a batch-1 copy of the model, one token at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.h"

namespace trainer {

// Continues `prompt` (token ids) by n tokens. The context is the last
// seq_len tokens; causal attention makes the logits at the last position
// depend only on what came before, so no cache is needed for correctness.
// Runs on the CPU from the fp32 weights (masters under mixed precision; one
// host vector per parameter, parameter_list order), wherever the model trained.
std::vector<int32_t> generate_tokens(const ModelDims& trained, const std::vector<std::vector<float>>& weights,
                                     int64_t seq_len,
                                     const std::vector<int32_t>& prompt, int n, float temperature,
                                     uint64_t seed);

// Bytes as printable text (byte-level vocabularies); others as ids.
std::string tokens_to_text(const std::vector<int32_t>& ids, int64_t vocab_size);

}  // namespace trainer
