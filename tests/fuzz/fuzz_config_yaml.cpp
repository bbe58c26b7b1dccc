// A YAML run configuration, as `trainer --config FILE` reads it: the text goes
// through load_config_text (load_config_file's whole work after reading the
// file), which parses, walks the schema, resolves and validates.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  trainer::Config c;
  try {
    // world_size 0: the layout the file itself describes (plan, export,
    // inspect); it reaches the parallel checks with any tp/pp/cp/dp the input
    // names instead of stopping at "world size 1".
    c = trainer::load_config_text(yaml, "fuzz.yaml", {}, 0);
  } catch (const std::exception&) {
    return 0;  // refused with a message (ConfigError): what bad input should get
  }

  // What the run does next with an accepted file: print its warnings, and
  // --print-config writes it back, which must load again (checkpoints store
  // the resolved YAML and resume from it).
  trainer::config_warnings(c);
  const std::string again = trainer::config_to_yaml(c);
  try {
    trainer::load_config_text(again, "fuzz.yaml (printed)", {}, 0);
  } catch (const trainer::ConfigError& e) {
    std::fprintf(stderr, "config_to_yaml wrote a configuration its loader refuses: %s\n--- input\n%s\n--- printed\n%s\n",
                 e.what(), yaml.c_str(), again.c_str());
    std::abort();
  }
  return 0;
}
