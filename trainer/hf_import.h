// `model.init_from: PATH`: a run starts from the weights of a Hugging Face
// model directory (checkpoint/hf_format.h) instead of random ones, with a
// fresh optimizer state. config.json is checked against the model
// configuration and the tensors against its shapes, every mismatch named.
#pragma once

#include "checkpoint/hf_format.h"
#include "config/config.h"

namespace trainer {

// Our tensors (names as model/params.h, whole, fp32) from model.init_from.
// Throws ConfigError (exit 2) listing every disagreement of config.json or
// of the tensors with the model configuration, std::runtime_error naming the
// file when the directory cannot be read.
TensorMap load_init_weights(const Config& c);

}  // namespace trainer
