#include "pipeline/stage_split.h"

#include <algorithm>
#include <limits>

#include "config/config.h"
#include "model/flops.h"
#include "model/sharding.h"

namespace trainer {

double embedding_flops(const ModelDims& d) {
  // A gather (and for gpt2 an add): memory-bound, counted as one operation
  // per element it moves.
  return double(d.N() * d.C) * (d.llama ? 1.0 : 2.0);
}

double layer_flops(const ModelDims& d, int64_t layer) {
  return layer_matmul_flops(d, layer) + attention_core_flops(d);
}

double head_flops(const ModelDims& d) {
  // The head's matmul and the cross-entropy's few passes over the logits.
  return head_matmul_flops(d) + 5 * double(d.N()) * double(d.vocab());
}

std::vector<double> stage_flops(const ModelDims& d, const std::vector<int64_t>& layers) {
  std::vector<double> out;
  int64_t first = 0;
  for (size_t s = 0; s < layers.size(); ++s) {
    double c = s == 0 ? embedding_flops(d) : 0;
    if (s + 1 == layers.size()) c += head_flops(d);
    for (int64_t i = first; i < first + layers[s]; ++i) c += layer_flops(d, i);
    first += layers[s];
    out.push_back(c);
  }
  return out;
}

std::vector<int64_t> balanced_stage_layers(const ModelDims& d, int stages) {
  const int64_t L = d.layers_total();
  even_stage_layers(L, stages);  // refuses fewer layers than stages, naming the keys
  // prefix[i]: FLOPs of layers [0, i).
  std::vector<double> prefix(size_t(L) + 1, 0);
  for (int64_t i = 0; i < L; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + layer_flops(d, i);
  auto cost = [&](int s, int64_t a, int64_t b) {  // stage s holding layers [a, b)
    double c = prefix[size_t(b)] - prefix[size_t(a)];
    if (s == 0) c += embedding_flops(d);
    if (s == stages - 1) c += head_flops(d);
    return c;
  };
  // best[s][i]: the smallest possible largest cost of stages 0..s holding
  // layers [0, i); cut[s][i]: where stage s starts then.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(size_t(stages), std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int64_t>> cut(size_t(stages), std::vector<int64_t>(size_t(L) + 1, 0));
  for (int64_t i = 1; i <= L; ++i) best[0][size_t(i)] = cost(0, 0, i);
  for (int s = 1; s < stages; ++s)
    for (int64_t i = s + 1; i <= L; ++i)
      for (int64_t j = s; j < i; ++j) {
        const double c = std::max(best[size_t(s - 1)][size_t(j)], cost(s, j, i));
        // Clearly better only (sums of equal layers may differ in the last
        // bit): the first, smallest j wins a tie, so the later stage takes
        // more layers and the earlier ones, which hold more micro-batches'
        // activations under 1F1B, fewer.
        if (c < best[size_t(s)][size_t(i)] * (1 - 1e-9)) {
          best[size_t(s)][size_t(i)] = c;
          cut[size_t(s)][size_t(i)] = j;
        }
      }
  std::vector<int64_t> layers(static_cast<size_t>(stages));
  int64_t end = L;
  for (int s = stages - 1; s >= 0; --s) {
    const int64_t start = s == 0 ? 0 : cut[size_t(s)][size_t(end)];
    layers[size_t(s)] = end - start;
    end = start;
  }
  return layers;
}

std::string format_layers(const std::vector<int64_t>& layers) {
  std::string s = "[";
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(layers[i]);
  }
  return s + "]";
}

}  // namespace trainer
