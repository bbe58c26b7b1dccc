#include "trainer/hf_import.h"

#include "checkpoint/hf_files.h"

namespace trainer {

TensorMap load_init_weights(const Config& c) {
  const std::string& dir = c.model.init_from;
  json::Value hf_cfg;
  const TensorMap hf = read_hf_dir(dir, &hf_cfg);
  const std::vector<std::string> bad = hf_config_mismatches(c, hf_cfg);
  if (!bad.empty()) {
    std::string msg = "model.init_from=" + dir + ": config.json does not describe the configured model (" +
                      std::to_string(bad.size()) + " difference(s)):";
    for (const std::string& b : bad) msg += "\n  " + b;
    throw ConfigError(msg + "\n(set the model keys to match the directory's config.json)");
  }
  return from_hf(c, hf, "model.init_from=" + dir);
}

}  // namespace trainer
