// Decoding with a key/value cache: the model of one sequence (batch 1) that
// keeps every layer's keys and values (after RoPE) of the tokens it has seen,
// so that each new token costs one token's forward instead of the whole
// context's. A chunk of n new tokens at positions p..p+n-1 (the prompt's
// prefill, then one token per step) runs the same blocks as training with
// T = n, except that attention reads the cached keys of positions 0..p+n-1
// through ops::attention_forward_pos / rope_forward_pos at those positions:
// for the chunk's rows that is exactly the causal attention of the whole
// sequence, so the logits equal the no-cache forward's up to the summation
// order of the matmuls (greedy tokens are equal: tests/test_kv_cache.cpp).
// Under sliding-window attention (ModelDims::window) the same op applies the
// window by position and reads only the cached keys inside it (positions
// p - window ..), so a step costs O(window), not O(p); the cache still
// holds every position of the sequence (no rolling buffer yet).
//
// The cache holds `window` positions (at most model.max_seq_len: learned
// positions end there). What happens when a sequence outgrows it is the
// caller's rule (infer/generate.h). Like the model code it runs on any
// device without knowing which: every buffer lives on `device`, the logits
// come back to the host. Weights, activations and cache are F32.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "model/transformer.h"

namespace trainer {

// The dims of one process scoring or decoding B = 1 sequence of T tokens from
// a trained model's: none of the training-time splits or savings (tp, cp, ep,
// pipeline stages, recompute, token dropping, separate documents), fp32.
ModelDims decode_dims(const ModelDims& trained, int64_t T);

class KvDecoder {
 public:
  // `trained`: the model's dims (B, T, parallel fields are ignored: one
  // process, one sequence). weights: the full fp32 tensors, one host vector
  // per parameter in parameter_list order of single_plan(trained).
  KvDecoder(const ModelDims& trained, const std::vector<std::vector<float>>& weights, int64_t window, Device device);
  ~KvDecoder();
  KvDecoder(const KvDecoder&) = delete;
  KvDecoder& operator=(const KvDecoder&) = delete;

  int64_t window() const { return window_; }
  int64_t cached() const { return cached_; }   // positions in the cache
  int64_t vocab() const { return dims_.vocab(); }
  // Runs `tokens` at positions cached()..cached()+n-1 and appends their keys
  // and values; returns the logits after the last one (vocab() floats).
  // Throws std::logic_error when they do not fit in the window.
  std::vector<float> append(const std::vector<int32_t>& tokens);
  // Forgets every cached position (the next append starts at position 0).
  void reset() { cached_ = 0; }

 private:
  struct Chunk;  // activation buffers for chunks of one length
  Chunk& chunk_of(int64_t n);

  ModelDims dims_;
  int64_t window_ = 0, cached_ = 0;
  Device device_;
  Model model_;                       // the weights (no gradients); its activations are unused
  Arena cache_arena_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [window, Hkv * D]
  Tensor positions_;                  // [window] I32: 0..window-1
  std::map<int64_t, std::unique_ptr<Chunk>> chunks_;
};

}  // namespace trainer
