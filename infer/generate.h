// Text from the trained model: the end-of-run sample (log.sample_tokens) and
// `trainer generate` (app/generate_command.h) continue a prompt token by
// token, sampling with temperature and top-k, or greedily.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/kv_cache.h"
#include "model/transformer.h"

namespace trainer {

struct SamplingOptions {
  float temperature = 0.8f;  // <= 0: greedy (the most likely token; ties: the lowest id)
  int top_k = 0;             // > 0: sample among the k most likely tokens only
  uint64_t seed = 1234;
};

// Draws token after token from logits; the random stream is a pure function
// of the seed, so a run's sample is reproducible.
class TokenPicker {
 public:
  explicit TokenPicker(const SamplingOptions& o) : opt_(o), state_(o.seed) {}
  int32_t pick(const float* logits, int64_t vocab);

 private:
  double uniform();
  SamplingOptions opt_;
  uint64_t state_;
  std::vector<double> p_;
  std::vector<int32_t> order_;
};

// The reference without a cache: every token re-runs the whole context (the
// last seq_len tokens) through a batch-1 copy of the model on the CPU;
// causal attention makes the logits at the last position depend only on what
// came before. weights: fp32, one host vector per parameter in
// parameter_list order. An empty prompt starts from token 0.
// A one-process fp32 model of `dims` on the CPU holding `weights` (the
// one-process plan's parameters, in its order); throws std::logic_error
// naming `what` and the parameter when they do not fit.
void load_replica(Model& m, const ModelDims& dims, const std::vector<std::vector<float>>& weights,
                  const char* what);

std::vector<int32_t> generate_tokens(const ModelDims& trained, const std::vector<std::vector<float>>& weights,
                                     int64_t seq_len, const std::vector<int32_t>& prompt, int n,
                                     const SamplingOptions& sampling);

// The same continuation with the key/value cache (model/kv_cache.h): the
// prompt is prefilled once, then each token is one step. The context is the
// decoder's window W: a prompt longer than W keeps its last W tokens, and
// when the cache is full the context restarts from the last W/2 tokens (one
// prefill of W/2 tokens every W/2 steps). As long as prompt and continuation
// fit in W the tokens are those of generate_tokens with seq_len = W (greedy:
// equal; tests/test_kv_cache.cpp); past it generate_tokens slides by one
// token per step and sees more context. on_token (may be empty) sees each
// token as it is drawn. An empty prompt starts from token 0.
std::vector<int32_t> generate_cached(KvDecoder& decoder, const std::vector<int32_t>& prompt, int n,
                                     const SamplingOptions& sampling,
                                     const std::function<void(int32_t)>& on_token = {});

}  // namespace trainer
