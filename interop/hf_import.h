// `model.init_from: PATH`: a run starts from the weights of a Hugging Face
// model directory (interop/hf_format.h) instead of random ones, with a
// fresh optimizer state. config.json is checked against the model
// configuration key by key (interop/hf_config_check.h: understood,
// without effect, or refused by name) and the tensors against its shapes,
// every mismatch named.
#pragma once

#include <string>
#include <vector>

#include "interop/hf_format.h"
#include "config/config.h"

namespace trainer {

// The model keys of the model.init_from directory's config.json that the
// configuration leaves at their defaults (not named by the YAML or a --set),
// taken into `c` (interop/hf_adopt.cpp): the architecture, every size,
// norm_eps, RoPE's theta and scaling, attention biases, the window, tied
// embeddings, the experts and router_aux_loss_coef. The training command
// calls it before the configuration is resolved and validated
// (load_config_file's before_resolve). Returns one start-up line listing
// what was taken (none: empty). A directory or config.json that cannot be
// read, or an architecture this trainer does not have, takes nothing
// (load_init_weights then says why).
std::vector<std::string> adopt_init_from_settings(Config& c);

// Our tensors (names as model/params.h, whole, fp32) from model.init_from.
// Throws ConfigError (exit 2) listing every disagreement of config.json or
// of the tensors with the model configuration and every config.json key it
// refuses (before reading any tensor), std::runtime_error naming the file
// when the directory cannot be read. `notes`: start-up lines about accepted
// keys (a dropout not applied, which aux loss coefficient wins).
TensorMap load_init_weights(const Config& c, std::vector<std::string>* notes = nullptr);

}  // namespace trainer
