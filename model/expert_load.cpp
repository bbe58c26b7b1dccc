#include "model/expert_load.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/device_memory.h"

namespace trainer {

void ExpertLoad::reset(int64_t layers, int64_t num_experts) {
  experts = num_experts;
  routed.assign(size_t(layers * num_experts), 0);
  kept.assign(size_t(layers * num_experts), 0);
}

void count_expert_load(const ModelDims& d, int64_t layer, const LayerActs& a, ExpertLoad& load) {
  const int64_t E = d.E, global = d.first_layer + layer;
  std::vector<int32_t> idx(size_t(a.topk_idx.numel())), off(size_t(E + 1));
  read_to_host(a.topk_idx, idx.data());
  read_to_host(a.offsets, off.data());
  double* routed = load.routed.data() + global * E;
  double* kept = load.kept.data() + global * E;
  for (int32_t e : idx)
    if (e >= 0 && e < E) routed[e] += 1;
  for (int64_t e = 0; e < E; ++e) kept[e] += off[size_t(e + 1)] - off[size_t(e)];
}

void sum_expert_load(ExpertLoad& load, Communicator& host, int tp) {
  // One all-reduce for both tables.
  std::vector<double> both(load.routed);
  both.insert(both.end(), load.kept.begin(), load.kept.end());
  if (host.size() > 1) host.all_reduce(Tensor(both.data(), DType::F64, {int64_t(both.size())}));
  for (double& x : both) x /= double(tp);
  const auto mid = both.begin() + long(load.routed.size());
  std::copy(both.begin(), mid, load.routed.begin());
  std::copy(mid, both.end(), load.kept.begin());
}

std::vector<LayerLoad> layer_loads(const ExpertLoad& load) {
  std::vector<LayerLoad> out;
  const int64_t E = load.experts;
  if (E == 0) return out;
  for (size_t l = 0; l * size_t(E) < load.routed.size(); ++l) {
    const double* r = load.routed.data() + l * size_t(E);
    const double* k = load.kept.data() + l * size_t(E);
    const double total = std::accumulate(r, r + E, 0.0);
    if (total <= 0) continue;
    LayerLoad x;
    x.layer = int64_t(l);
    x.tokens.assign(r, r + E);
    x.dropped = 1.0 - std::accumulate(k, k + E, 0.0) / total;
    x.max_over_mean = *std::max_element(r, r + E) / (total / double(E));
    out.push_back(std::move(x));
  }
  return out;
}

std::string format_expert_load(const std::vector<LayerLoad>& loads) {
  std::string s = "  moe load:";
  char buf[96];
  for (size_t i = 0; i < loads.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s layer %lld max/mean %.2f dropped %.1f%%", i ? " |" : "",
                  (long long)loads[i].layer, loads[i].max_over_mean, 100.0 * loads[i].dropped);
    s += buf;
  }
  return s + "\n";
}

std::string expert_load_json(int64_t step, const std::vector<LayerLoad>& loads) {
  std::string s = "{\"step\": " + std::to_string(step) + ", \"moe\": [";
  char buf[64];
  for (size_t i = 0; i < loads.size(); ++i) {
    s += i ? ", " : "";
    s += "{\"layer\": " + std::to_string(loads[i].layer) + ", \"tokens\": [";
    for (size_t e = 0; e < loads[i].tokens.size(); ++e)
      s += (e ? ", " : "") + std::to_string(int64_t(loads[i].tokens[e]));
    std::snprintf(buf, sizeof buf, "], \"dropped\": %.6g, \"max_over_mean\": %.6g}", loads[i].dropped,
                  loads[i].max_over_mean);
    s += buf;
  }
  return s + "]}";
}

}  // namespace trainer
