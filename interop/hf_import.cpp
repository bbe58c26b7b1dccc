#include "interop/hf_import.h"

#include "interop/hf_config_check.h"
#include "interop/hf_files.h"

namespace trainer {

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
