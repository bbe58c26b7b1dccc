// `--set KEY=VALUE` overrides: each line of the input is one --set argument,
// applied in order over the defaults by load_config_text, as main() passes
// the command line's overrides.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  for (size_t at = 0; at <= text.size();) {
    const size_t nl = text.find('\n', at);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    overrides.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  // A few sets are what a command line holds; thousands only slow each run.
  if (overrides.size() > 64) return 0;
  // Validation wants data.train; the first line may replace it.
  const std::string base = "data: {train: [train.bin]}\n";
  try {
    const trainer::Config c = trainer::load_config_text(base, "fuzz.yaml", overrides, 0);
    trainer::config_warnings(c);
    trainer::config_to_yaml(c);
  } catch (const std::exception&) {
    // ConfigError naming the --set: the expected answer to a bad override.
  }
  return 0;
}
