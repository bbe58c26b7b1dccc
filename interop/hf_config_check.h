// What a Hugging Face config.json says about the model, key by key, against
// the model configuration a run starts from it with (`model.init_from`).
// Every key is one of:
//  - understood: mapped to a model key and compared (hidden_size ->
//    model.d_model, rope_scaling -> model.rope_scaling.*, attention_bias ->
//    model.attn_bias, ...); a difference is a problem naming both;
//  - known not to change the function the weights compute: ids of special
//    tokens, torch_dtype, use_cache, generation and output settings, ...;
//    training-only noise this trainer does not apply (dropout, router
//    jitter) is accepted with a note;
//  - refused by name: a feature this trainer does not implement (yarn or
//    dynamic RoPE scaling, MLP biases, a quantized checkpoint, a sliding
//    window the run's sequences reach, ...), unless its value is the no-op
//    one (rope_scaling: null, mlp_bias: false, ...);
//  - unknown: refused too, so a feature added to transformers later can
//    never be ignored silently.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/strict_json.h"
#include "config/config.h"

namespace trainer {

struct HfConfigReview {
  // Differences and refusals, one line each naming the config.json key, its
  // value and (for a difference) our key and value. Any: exit 2.
  std::vector<std::string> problems;
  // Accepted keys worth a start-up line (a dropout this trainer does not
  // apply, which router_aux_loss_coef wins).
  std::vector<std::string> notes;
};

HfConfigReview review_hf_config(const Config& c, const json::Value& hf);

}  // namespace trainer
