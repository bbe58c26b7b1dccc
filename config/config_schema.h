// The one table of configuration keys. Loading, --set, config_to_yaml, the
// range/enum checks and the "did you mean" suggestions all read it, so adding a
// key to Config means adding one row in config_schema.cpp and nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/config.h"

namespace trainer {

enum class KeyType { Int, Int64, UInt64, Double, Bool, String, StringList, IntList };

// A plain pointer-to-member cannot reach model.moe.top_k (two levels deep), so
// each row holds a captureless function returning a reference to its field;
// the alternative held also fixes the C++ type the key is parsed into.
using FieldRef = std::variant<int& (*)(Config&), int64_t& (*)(Config&), uint64_t& (*)(Config&),
                              double& (*)(Config&), bool& (*)(Config&),
                              std::string& (*)(Config&),
                              std::vector<std::string>& (*)(Config&), std::vector<int>& (*)(Config&)>;

struct KeySpec {
  std::string_view path;     // "model.moe.top_k"
  KeyType type;
  FieldRef field;
  // Enum keys: "llama|gpt2". With open_choice the list only names the special
  // values and anything else (a path) is accepted too.
  std::string_view choices;
  bool open_choice = false;
  // Numeric range; NaN bound = unbounded on that side.
  double min;
  double max;
  bool min_exclusive = false;
  bool max_exclusive = false;
  // Names other trainers use for the same thing (space separated); a key
  // spelled like one of them gets this key suggested.
  std::string_view aka;
  std::string_view help;

  std::string_view leaf() const;     // "top_k"
  std::string_view parent() const;   // "model.moe"
  std::vector<std::string> choice_list() const;
};

const std::vector<KeySpec>& config_schema();
const KeySpec* find_key(std::string_view path);
// "model", "model.moe", ...: prefixes that hold keys, in schema order.
const std::vector<std::string>& config_sections();
bool is_section(std::string_view path);

// The closest known key or section to a path nobody declared, or "" when
// nothing is close enough to be a plausible typo.
std::string suggest_key(std::string_view unknown_path);

// "an integer", "true or false", "a list of strings", ...
std::string type_phrase(KeyType t);
// The value as a YAML flow scalar/list that load_config parses back exactly.
std::string value_yaml(const KeySpec& k, const Config& c);
// What the key accepts, for messages and --help: "llama | gpt2", ">= 1", "0 .. 3".
std::string allowed_phrase(const KeySpec& k);
// "KEY: must be >= 1, got 0" style problem with the key's current value, or
// nullopt when the value is inside the declared range/choices.
std::optional<std::string> check_key_value(const KeySpec& k, const Config& c);

// A table of every key: path, type, default, allowed values, description.
std::string config_schema_help();

}  // namespace trainer

namespace trainer {

// parallel.dp with its 0 ("auto") replaced: world / (tp*pp*cp), at least 1.
int data_parallel_size(const Config& c, int world_size);

}  // namespace trainer
