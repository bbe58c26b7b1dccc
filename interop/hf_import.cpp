#include "interop/hf_import.h"

#include <cmath>

#include "interop/hf_config_check.h"
#include "interop/hf_files.h"

namespace trainer {

std::vector<std::string> adopt_init_from_settings(Config& c) {
  std::vector<std::string> lines;
  if (c.model.init_from.empty() || c.model.moe.num_experts == 0) return lines;
  json::Value hf;
  try {
    hf = read_hf_config(c.model.init_from);
  } catch (const std::exception&) {
    return lines;
  }
  const json::Value* coef = json::find(hf, "router_aux_loss_coef");
  if (coef && coef->is_number() && !c.given.count("model.moe.aux_loss_coeff")) {
    const double v = coef->get<double>();
    if (std::isfinite(v) && v >= 0 && v != c.model.moe.aux_loss_coeff) {
      c.model.moe.aux_loss_coeff = v;
      lines.push_back("init: model.moe.aux_loss_coeff=" + json::dump(json::Value(v)) + " from router_aux_loss_coef of " +
                      c.model.init_from + "/config.json (a value set in the configuration wins)");
    }
  }
  return lines;
}

TensorMap load_init_weights(const Config& c, std::vector<std::string>* notes) {
  const std::string& dir = c.model.init_from;
  const HfConfigReview review = review_hf_config(c, read_hf_config(dir));
  if (!review.problems.empty()) {
    std::string msg = "model.init_from=" + dir + ": " + std::to_string(review.problems.size()) +
                      " problem(s) with its config.json (a difference from the model keys, or a key this trainer "
                      "does not implement):";
    for (const std::string& b : review.problems) msg += "\n  " + b;
    throw ConfigError(msg + "\n(set the model keys to match the directory's config.json; docs/HUGGING_FACE.md, "
                            "\"Hugging Face models in and out\", lists what is supported)");
  }
  if (notes)
    for (const std::string& n : review.notes) notes->push_back("init: " + n);
  const TensorMap hf = read_hf_tensors(dir);
  return from_hf(c, hf, "model.init_from=" + dir);
}

}  // namespace trainer
