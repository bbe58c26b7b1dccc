#include "infer/choice_score.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "infer/generate.h"
#include "model/kv_cache.h"
#include "model/transformer.h"

namespace trainer {

namespace {

// Sum of log p(ending token | everything before it) of one sequence.
double loglik(Model& g, const std::vector<int32_t>& context, const std::vector<int32_t>& ending) {
  const int64_t T = g.dims.T;
  std::vector<int32_t> seq = context;
  seq.insert(seq.end(), ending.begin(), ending.end());
  if (int64_t(ending.size()) > T)
    throw std::runtime_error("an ending of " + std::to_string(ending.size()) + " tokens is longer than the context "
                             "window of " + std::to_string(T) + " tokens (train.seq_len)");
  const int64_t keep = std::min<int64_t>(int64_t(seq.size()), T + 1);
  const int64_t first = int64_t(seq.size()) - keep;  // tokens cut off the front
  const int64_t n = keep - 1;                         // inputs
  const int64_t ending_from = int64_t(seq.size()) - int64_t(ending.size()) - first;  // first ending token, in window
  int32_t* ids = g.acts.ids.i32();
  int32_t* tg = g.acts.targets.i32();
  std::fill(ids, ids + T, 0);
  std::fill(tg, tg + T, -1);
  for (int64_t t = 0; t < n; ++t) {
    ids[t] = seq[size_t(first + t)];
    if (t + 1 >= ending_from) tg[t] = seq[size_t(first + t + 1)];
  }
  return -model_forward(g, 0.f).loss_sum;  // losses are -log p of the kept targets
}

}  // namespace

ChoiceResult score_choices(const ModelDims& trained, const std::vector<std::vector<float>>& weights,
                           const std::vector<ChoiceItem>& items, int64_t max_len) {
  Model g;
  load_replica(g, decode_dims(trained, max_len), weights, "score_choices");
  ChoiceResult r;
  for (const ChoiceItem& it : items) {
    std::vector<double> ll;
    for (const auto& ending : it.endings) ll.push_back(loglik(g, it.context, ending));
    int best = 0, best_norm = 0;
    for (size_t k = 1; k < ll.size(); ++k) {
      if (ll[k] > ll[size_t(best)]) best = int(k);
      if (ll[k] / double(it.ending_bytes[k]) > ll[size_t(best_norm)] / double(it.ending_bytes[size_t(best_norm)]))
        best_norm = int(k);
    }
    r.acc += best == it.label;
    r.acc_norm += best_norm == it.label;
    r.pick.push_back(best);
    r.pick_norm.push_back(best_norm);
    r.loglik.push_back(std::move(ll));
  }
  r.acc /= double(std::max<size_t>(1, items.size()));
  r.acc_norm /= double(std::max<size_t>(1, items.size()));
  return r;
}

}  // namespace trainer
