#include "trainer/generate.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/device_memory.h"

namespace trainer {

std::vector<int32_t> generate_tokens(const ModelDims& trained, const std::vector<std::vector<float>>& weights,
                                     int64_t seq_len,
                                     const std::vector<int32_t>& prompt, int n, float temperature,
                                     uint64_t seed) {
  ModelDims d = trained;
  d.B = 1;
  d.T = seq_len;
  d.capacity = 0;  // no token dropping at inference
  d.act = DType::F32;
  Model g;
  build_model(g, d, 0.0, Device::CPU);
  if (weights.size() != g.param_tensors.size()) throw std::logic_error("generate_tokens: parameter count mismatch");
  for (size_t i = 0; i < g.param_tensors.size(); ++i) {
    if (int64_t(weights[i].size()) != g.param_tensors[i].numel())
      throw std::logic_error("generate_tokens: size mismatch of parameter " + g.params[i].spec.name);
    write_from_host(g.param_tensors[i], weights[i].data());
  }

  std::vector<int32_t> seq = prompt.empty() ? std::vector<int32_t>{0} : prompt;
  std::vector<int32_t> out;
  uint64_t state = seed;
  auto uniform = [&] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return double((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
  };
  std::vector<double> p(size_t(d.V));
  for (int step = 0; step < n; ++step) {
    const int64_t len = std::min<int64_t>(int64_t(seq.size()), d.T);
    int32_t* ids = g.acts.ids.i32();
    std::fill(ids, ids + d.T, 0);
    std::copy(seq.end() - len, seq.end(), ids);
    std::fill(g.acts.targets.i32(), g.acts.targets.i32() + d.T, -1);
    model_forward(g, 0.f);
    const float* logits = g.acts.logits.f32() + (len - 1) * d.V;
    double mx = -1e300, sum = 0;
    for (int64_t v = 0; v < d.V; ++v) mx = std::max(mx, double(logits[v]));
    for (int64_t v = 0; v < d.V; ++v) sum += p[size_t(v)] = std::exp((logits[v] - mx) / temperature);
    double r = uniform() * sum;
    int32_t pick = int32_t(d.V - 1);
    for (int64_t v = 0; v < d.V; ++v) {
      r -= p[size_t(v)];
      if (r <= 0) {
        pick = int32_t(v);
        break;
      }
    }
    seq.push_back(pick);
    out.push_back(pick);
  }
  return out;
}

std::string tokens_to_text(const std::vector<int32_t>& ids, int64_t vocab_size) {
  std::string s;
  if (vocab_size == 256) {
    for (int32_t t : ids) {
      const unsigned char c = (unsigned char)t;
      if (c == '\n' || c == '\t' || (c >= 32 && c < 127) || c >= 128)
        s += char(c);
      else
        s += '?';
    }
    return s;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

}  // namespace trainer
