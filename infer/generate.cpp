#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "core/device_memory.h"

namespace trainer {

double TokenPicker::uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

int32_t TokenPicker::pick(const float* logits, int64_t vocab) {
  if (opt_.temperature <= 0) return int32_t(std::max_element(logits, logits + vocab) - logits);
  order_.resize(size_t(vocab));
  std::iota(order_.begin(), order_.end(), 0);
  int64_t keep = vocab;
  if (opt_.top_k > 0 && opt_.top_k < vocab) {
    keep = opt_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
  }
  double mx = -1e300, sum = 0;
  for (int64_t i = 0; i < keep; ++i) mx = std::max(mx, double(logits[order_[size_t(i)]]));
  p_.resize(size_t(keep));
  for (int64_t i = 0; i < keep; ++i) sum += p_[size_t(i)] = std::exp((logits[order_[size_t(i)]] - mx) / opt_.temperature);
  double r = uniform() * sum;
  for (int64_t i = 0; i < keep; ++i) {
    r -= p_[size_t(i)];
    if (r <= 0) return order_[size_t(i)];
  }
  return order_[size_t(keep - 1)];
}

void load_replica(Model& m, const ModelDims& dims, const std::vector<std::vector<float>>& weights,
                  const char* what) {
  build_model(m, dims, 0.0, Device::CPU);
  if (weights.size() != m.param_tensors.size())
    throw std::logic_error(std::string(what) + ": parameter count mismatch");
  for (size_t i = 0; i < m.param_tensors.size(); ++i) {
    if (int64_t(weights[i].size()) != m.param_tensors[i].numel())
      throw std::logic_error(std::string(what) + ": size mismatch of parameter " + m.params[i].spec.name);
    write_from_host(m.param_tensors[i], weights[i].data());
  }
}

std::vector<int32_t> generate_tokens(const ModelDims& trained, const std::vector<std::vector<float>>& weights,
                                     int64_t seq_len, const std::vector<int32_t>& prompt, int n,
                                     const SamplingOptions& sampling) {
  ModelDims d = trained;
  d.B = 1;
  d.T = seq_len;
  d.capacity = 0;  // no token dropping at inference
  d.documents = false;  // the context is one document
  d.act = DType::F32;
  Model g;
  load_replica(g, d, weights, "generate_tokens");

  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{0} : prompt;
  std::vector<int32_t> out;
  TokenPicker picker(sampling);
  for (int step = 0; step < n; ++step) {
    const int64_t len = std::min<int64_t>(int64_t(seq.size()), d.T);
    int32_t* ids = g.acts.ids.i32();
    std::fill(ids, ids + d.T, 0);
    std::copy(seq.end() - len, seq.end(), ids);
    std::fill(g.acts.targets.i32(), g.acts.targets.i32() + d.T, -1);
    model_forward(g, 0.f);
    const int32_t pick = picker.pick(g.acts.logits.f32() + (len - 1) * d.V, d.vocab());
    seq.push_back(pick);
    out.push_back(pick);
  }
  return out;
}

std::vector<int32_t> generate_cached(KvDecoder& decoder, const std::vector<int32_t>& prompt, int n,
                                     const SamplingOptions& sampling, const std::function<void(int32_t)>& on_token) {
  const int64_t W = decoder.window();
  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{0} : prompt;
  std::vector<int32_t> out;
  if (n <= 0) return out;
  TokenPicker picker(sampling);
  decoder.reset();
  const int64_t first = std::max<int64_t>(0, int64_t(seq.size()) - W);
  std::vector<float> logits = decoder.append(std::vector<int32_t>(seq.begin() + first, seq.end()));
  for (int step = 0; step < n; ++step) {
    const int32_t tok = picker.pick(logits.data(), decoder.vocab());
    seq.push_back(tok);
    out.push_back(tok);
    if (on_token) on_token(tok);
    if (step + 1 == n) break;
    if (decoder.cached() < W) {
      logits = decoder.append({tok});
    } else {
      const int64_t keep = std::max<int64_t>(1, W / 2);
      decoder.reset();
      logits = decoder.append(std::vector<int32_t>(seq.end() - keep, seq.end()));
    }
  }
  return out;
}

}  // namespace trainer
