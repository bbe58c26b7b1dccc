// Derived values (FFN widths, "auto" settings) and the resolved config as YAML.
#include <algorithm>
#include <sstream>

#include "config/config.h"
#include "config/config_schema.h"

namespace trainer {

int Config::d_ff() const {
  if (model.d_ff > 0) return model.d_ff;
  if (model.arch == "gpt2") return 4 * model.d_model;
  // SwiGLU has three matrices instead of two, so 8/3 keeps the parameter count
  // of a 4x MLP; multiples of 32 keep GEMM tiles full.
  const int raw = 8 * model.d_model / 3;
  return (raw + 31) / 32 * 32;
}

int Config::moe_d_ff() const { return model.moe.d_ff > 0 ? model.moe.d_ff : d_ff(); }

int data_parallel_size(const Config& c, int world_size) {
  if (c.parallel.dp > 0) return c.parallel.dp;
  const int model_parallel = std::max(1, c.parallel.tp * c.parallel.pp * c.parallel.cp);
  return std::max(1, world_size / model_parallel);
}

void resolve_config(Config& c, int world_size) {
  if (c.model.tie_embeddings == "auto")
    c.model.tie_embeddings = c.model.arch == "gpt2" ? "true" : "false";
  if (c.train.global_batch_size == 0)
    c.train.global_batch_size = c.train.micro_batch_size * data_parallel_size(c, world_size);
}

std::string config_to_yaml(const Config& c) {
  std::ostringstream os;
  os << "# Resolved configuration (from " << c.source << "): every key, defaults included.\n"
     << "# Loading this file gives the same settings.\n";
  std::vector<std::string> open;  // enclosing sections of the previous key
  for (const auto& k : config_schema()) {
    std::vector<std::string> sections;
    for (size_t dot = k.path.find('.'); dot != std::string_view::npos; dot = k.path.find('.', dot + 1))
      sections.emplace_back(k.path.substr(0, dot));
    size_t common = 0;
    while (common < open.size() && common < sections.size() && open[common] == sections[common]) ++common;
    for (size_t d = common; d < sections.size(); ++d) {
      const std::string& s = sections[d];
      const std::string name = d == 0 ? s : s.substr(sections[d - 1].size() + 1);
      if (d == 0 && !open.empty()) os << "\n";
      os << std::string(2 * d, ' ') << name << ":\n";
    }
    open = sections;

    std::string line = std::string(2 * sections.size(), ' ') + std::string(k.leaf()) + ": " + value_yaml(k, c);
    std::string comment(k.help);
    if (!k.choices.empty()) comment = allowed_phrase(k) + " -- " + comment;
    line += std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') + "# " + comment;
    os << line << "\n";
  }
  return os.str();
}

}  // namespace trainer
