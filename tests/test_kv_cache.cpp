// The key/value-cache decoder (model/kv_cache.h) against the no-cache
// reference (infer/generate.h: the whole context re-run per token): for
// llama with grouped-query attention, gpt2 (learned positions) and a llama
// MoE, the logits after every token agree within 1e-4 of their largest
// magnitude (only the matmuls' summation order differs: one row instead of
// the whole window), and greedy decoding gives the same tokens exactly.
// The same under sliding-window attention (model.sliding_window), where
// each step reads only the cached keys inside the window.
// Past the window, the cached path's rule (restart from the last W/2 tokens)
// is checked against a fresh prefill of those tokens, and a prompt longer
// than the window keeps its last W tokens like the no-cache path.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/kv_cache.h"
#include "model/sharding.h"
#include "model/transformer.h"
#include "infer/generate.h"

using namespace trainer;

namespace {

constexpr int64_t kWindow = 24;

ModelDims dims_of(const std::string& model) {
  const Config c = load_config_text("model: " + model + "\ntrain: {seq_len: 24}\ndata: {train: [x.bin]}\n", "<test>", {});
  return make_dims(c, 1, kWindow);
}

// A larger init than training's 0.02 gives logits with clear winners, so
// that greedy decoding tests the model and not rounding between near-ties.
// Biases get values too, or the cached path would never add them.
std::vector<std::vector<float>> weights_of(const ModelDims& d) {
  std::vector<std::vector<float>> w;
  for (ParamInfo p : single_plan(d, 0.02).params) {
    if (p.init == Init::Normal) p.init_std = 0.3f;
    if (p.init == Init::Zeros) p.init = Init::Normal, p.init_std = 0.1f;
    w.push_back(initial_values(p, 7));
  }
  return w;
}

// Logits of the no-cache model after each prefix of `seq` (one full forward).
std::vector<std::vector<float>> reference_logits(const ModelDims& trained, const std::vector<std::vector<float>>& w,
                                                 const std::vector<int32_t>& seq) {
  ModelDims d = trained;
  d.B = 1;
  d.T = int64_t(seq.size());
  d.capacity = 0;
  Model m;
  build_model(m, d, 0.0, Device::CPU);
  for (size_t i = 0; i < w.size(); ++i) std::copy(w[i].begin(), w[i].end(), m.param_tensors[i].f32());
  std::copy(seq.begin(), seq.end(), m.acts.ids.i32());
  std::fill(m.acts.targets.i32(), m.acts.targets.i32() + d.T, -1);
  model_forward(m, 0.f);
  std::vector<std::vector<float>> out;
  for (int64_t t = 0; t < d.T; ++t)
    out.emplace_back(m.acts.logits.f32() + t * d.V, m.acts.logits.f32() + t * d.V + d.vocab());
  return out;
}

void check_model(const std::string& name, const std::string& model) {
  const ModelDims d = dims_of(model);
  const auto w = weights_of(d);
  const std::vector<int32_t> prompt = {3, 17, 5, 40, 9};

  // Logits: prefill of the prompt, then one token per step.
  std::vector<int32_t> seq = prompt;
  for (int i = 0; int64_t(seq.size()) < kWindow; ++i) seq.push_back(int32_t((i * 13 + 7) % d.vocab()));
  const auto ref = reference_logits(d, w, seq);
  KvDecoder dec(d, w, kWindow, Device::CPU);
  double err = 0, scale = 0;
  auto compare = [&](const std::vector<float>& got, size_t pos) {
    REQUIRE(got.size() == ref[pos].size());
    for (size_t v = 0; v < got.size(); ++v) {
      err = std::max(err, double(std::fabs(got[v] - ref[pos][v])));
      scale = std::max(scale, double(std::fabs(ref[pos][v])));
    }
  };
  compare(dec.append(prompt), prompt.size() - 1);
  for (size_t t = prompt.size(); t < seq.size(); ++t) compare(dec.append({seq[t]}), t);
  CHECK(dec.cached() == kWindow);
  const double tol = 1e-4 * scale;
  std::printf("kv cache %s: logits of %lld positions, max |cached - no cache| %.3g (largest logit %.3g, tolerance %.3g)\n",
              name.c_str(), (long long)kWindow - int64_t(prompt.size()) + 1, err, scale, tol);
  CHECK(err <= tol);
  CHECK(err == err);  // NaN never passes

  // Greedy decoding within the window: the same tokens exactly.
  SamplingOptions greedy;
  greedy.temperature = 0;
  const int n = int(kWindow - int64_t(prompt.size()));
  const auto cached = generate_cached(dec, prompt, n, greedy);
  const auto plain = generate_tokens(d, w, kWindow, prompt, n, greedy);
  size_t same = 0;
  while (same < plain.size() && same < cached.size() && cached[same] == plain[same]) ++same;
  std::string a, b;
  for (int32_t t : cached) a += std::to_string(t) + " ";
  for (int32_t t : plain) b += std::to_string(t) + " ";
  std::printf("kv cache %s: greedy, %d tokens: cached   %s\n%*s no cache %s-> %zu of %zu equal\n", name.c_str(), n,
              a.c_str(), int(name.size() + 21 + std::to_string(n).size()), "", b.c_str(), same, plain.size());
  CHECK(cached == plain);
  // Not a constant sequence: the comparison means something.
  CHECK(std::count(plain.begin(), plain.end(), plain[0]) < int64_t(plain.size()));

  // Past the window: after 2W tokens the cached path has restarted from the
  // last W/2 tokens; its next logits equal those of a fresh prefill of the
  // tokens since the last restart.
  const int long_n = int(2 * kWindow);
  const auto longer = generate_cached(dec, prompt, long_n, greedy);
  CHECK(longer.size() == size_t(long_n));
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), longer.begin(), longer.end());
  const int64_t context = dec.cached();
  CHECK(context >= kWindow / 2);
  CHECK(context <= kWindow);
  std::vector<int32_t> tail(all.end() - 1 - context, all.end() - 1);
  KvDecoder fresh(d, w, kWindow, Device::CPU);
  const std::vector<float> l = fresh.append(tail);
  CHECK(int32_t(std::max_element(l.begin(), l.end()) - l.begin()) == all.back());

  // A prompt longer than the window keeps its last W tokens, as the no-cache
  // path does: the first token is the same.
  std::vector<int32_t> long_prompt = all;
  long_prompt.resize(size_t(kWindow + 7));
  const auto first_cached = generate_cached(dec, long_prompt, 1, greedy);
  const auto first_plain = generate_tokens(d, w, kWindow, long_prompt, 1, greedy);
  CHECK(dec.cached() == kWindow);
  CHECK(first_cached == first_plain);
}

}  // namespace

TEST_CASE("kv cache: llama GQA logits and greedy tokens equal the no-cache path", "[kv_cache]") {
  check_model("llama gqa", "{arch: llama, vocab_size: 61, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                           "max_seq_len: 32}");
}

// Decoding rotates by explicit positions (rope_forward_pos): with a scaled
// RoPE they must still be the training rotation's.
TEST_CASE("kv cache: llama with q/k/v/o biases and llama3 RoPE scaling equals the no-cache path", "[kv_cache][rope]") {
  check_model("llama bias llama3", "{arch: llama, vocab_size: 61, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                                   "max_seq_len: 32, attn_bias: qkvo, rope_scaling: {type: llama3, factor: 4.0, "
                                   "original_max_seq_len: 8}}");
}

TEST_CASE("kv cache: gpt2 learned positions logits and greedy tokens equal the no-cache path", "[kv_cache]") {
  check_model("gpt2", "{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32}");
}

TEST_CASE("kv cache: llama MoE logits and greedy tokens equal the no-cache path", "[kv_cache]") {
  check_model("moe", "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 1, "
                     "max_seq_len: 32, moe: {num_experts: 4, top_k: 2, every: 1}}");
}

TEST_CASE("kv cache: sliding-window attention (llama GQA, gpt2) equals the no-cache path", "[kv_cache][window]") {
  // model.sliding_window 5 of 24 positions: each decoded token reads only
  // the cached keys of its window; the reference runs the whole context
  // through attention_forward with the same window.
  check_model("llama gqa window 5", "{arch: llama, vocab_size: 61, d_model: 32, n_layers: 2, n_heads: 4, "
                                    "n_kv_heads: 2, max_seq_len: 32, sliding_window: 5}");
  check_model("gpt2 window 3", "{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, max_seq_len: 32, "
                               "sliding_window: 3}");
}

TEST_CASE("kv cache: a window changes the logits (the windowed test above is not blind)", "[kv_cache][window]") {
  const std::string model = "{arch: llama, vocab_size: 61, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, "
                            "max_seq_len: 32";
  const ModelDims full = dims_of(model + "}"), windowed = dims_of(model + ", sliding_window: 5}");
  REQUIRE(windowed.window == 5);
  const auto w = weights_of(full);
  std::vector<int32_t> seq;
  for (int i = 0; i < 16; ++i) seq.push_back(int32_t((i * 13 + 7) % 61));
  KvDecoder a(full, w, kWindow, Device::CPU), b(windowed, w, kWindow, Device::CPU);
  const std::vector<float> la = a.append(seq), lb = b.append(seq);
  double diff = 0;
  for (size_t v = 0; v < la.size(); ++v) diff = std::max(diff, double(std::fabs(la[v] - lb[v])));
  std::printf("kv cache: last logits with and without a window of 5 over 16 tokens differ by up to %.3g\n", diff);
  CHECK(diff > 1e-2);
}

TEST_CASE("kv cache: a chunk past the window and a window past gpt2 positions are refused", "[kv_cache]") {
  const ModelDims d = dims_of("{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 1, n_heads: 4, max_seq_len: 32}");
  const auto w = weights_of(d);
  CHECK_THROWS_WITH(KvDecoder(d, w, 33, Device::CPU), Catch::Contains("longer than the learned position table"));
  KvDecoder dec(d, w, 8, Device::CPU);
  dec.append({1, 2, 3, 4, 5, 6});
  CHECK_THROWS_WITH(dec.append({1, 2, 3}), Catch::Contains("do not fit in a window of 8"));
}

TEST_CASE("sampling: top-k draws only among the k most likely, temperature 0 is the argmax", "[kv_cache]") {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  SamplingOptions o;
  o.temperature = 0;
  CHECK(TokenPicker(o).pick(logits.data(), 5) == 1);
  o.temperature = 5;  // nearly uniform
  o.top_k = 2;
  TokenPicker p(o);
  int seen[5] = {0, 0, 0, 0, 0};
  for (int i = 0; i < 400; ++i) ++seen[p.pick(logits.data(), 5)];
  std::printf("top-k 2 of 400 draws: %d %d %d %d %d\n", seen[0], seen[1], seen[2], seen[3], seen[4]);
  CHECK(seen[0] + seen[2] + seen[4] == 0);
  CHECK(seen[1] > 100);
  CHECK(seen[3] > 100);
}
