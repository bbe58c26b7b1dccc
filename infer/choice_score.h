// Multiple-choice scoring as lm-eval scores HellaSwag: each ending's
// log-likelihood as the continuation of the context; acc picks the ending of
// the highest log-likelihood, acc_norm the highest log-likelihood per byte of
// the ending (lm-eval divides by the ending's length in characters: the same
// for ASCII text).
#pragma once

#include <cstdint>
#include <vector>

#include "model/dims.h"

namespace trainer {

struct ChoiceItem {
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> endings;
  std::vector<int64_t> ending_bytes;
  int label = 0;
};

struct ChoiceResult {
  std::vector<std::vector<double>> loglik;  // per example, per ending
  std::vector<int> pick, pick_norm;         // argmax of loglik, of loglik / bytes
  double acc = 0, acc_norm = 0;             // shares of examples picked right
};

// Scores `items` with a full fp32 replica of the trained model (weights in the
// one-process plan's order) on the CPU, one (context, ending) sequence of at
// most `max_len` tokens per forward; a longer one keeps its last max_len + 1
// tokens (the context's front is cut, never the ending).
ChoiceResult score_choices(const ModelDims& trained, const std::vector<std::vector<float>>& weights,
                           const std::vector<ChoiceItem>& items, int64_t max_len);

}  // namespace trainer
