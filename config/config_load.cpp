// YAML text / --set overrides -> Config. Every mistake becomes a ConfigError
// that names the key path and where it was written; no yaml-cpp exception
// text reaches the user unconverted.
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "config/config.h"
#include "config/config_schema.h"
#include "config/hardware_file.h"

namespace trainer {
namespace {

std::string lower(std::string s) {
  for (auto& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// Long values are cut so one bad line cannot flood the terminal.
std::string quote(const std::string& s) {
  std::string shown = s.size() > 60 ? s.substr(0, 57) + "..." : s;
  return "'" + shown + "'";
}

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return quote(n.Scalar());
    default: return "an undefined value";
  }
}

bool mark_known(const YAML::Mark& m) { return m.line >= 0 && m.column >= 0; }

bool parse_bool(const std::string& text, bool& out) {
  const std::string t = lower(trim(text));
  if (t == "true" || t == "yes" || t == "on") { out = true; return true; }
  if (t == "false" || t == "no" || t == "off") { out = false; return true; }
  return false;
}

enum class IntResult { Ok, NotInteger, OutOfRange };

// Strict decimal: "1e3", "0x10" and "64.0" are rejected rather than guessed at.
template <typename T>
IntResult parse_integer(const std::string& raw, T& out) {
  std::string t = trim(raw);
  if (!t.empty() && t[0] == '+') t.erase(0, 1);
  if (t.empty()) return IntResult::NotInteger;
  size_t i = t[0] == '-' ? 1 : 0;
  if (i == t.size()) return IntResult::NotInteger;
  for (size_t j = i; j < t.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(t[j]))) return IntResult::NotInteger;
  if (std::is_unsigned_v<T> && t[0] == '-') return IntResult::OutOfRange;
  auto r = std::from_chars(t.data(), t.data() + t.size(), out);
  if (r.ec == std::errc::result_out_of_range) return IntResult::OutOfRange;
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return IntResult::NotInteger;
  return IntResult::Ok;
}

enum class DoubleResult { Ok, NotNumber, NotFinite };

DoubleResult parse_number(const std::string& raw, double& out) {
  const std::string t = trim(raw);
  const std::string l = lower(t);
  // YAML's spellings of infinity and NaN are numbers, just unusable ones.
  for (const char* s : {".inf", "+.inf", "-.inf", ".nan", "inf", "-inf", "nan", "infinity", "-infinity"})
    if (l == s) return DoubleResult::NotFinite;
  if (t.empty()) return DoubleResult::NotNumber;
  for (char ch : t)
    if (!(std::isdigit(static_cast<unsigned char>(ch)) || ch == '.' || ch == 'e' || ch == 'E' ||
          ch == '+' || ch == '-'))
      return DoubleResult::NotNumber;
  errno = 0;
  char* end = nullptr;
  out = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return DoubleResult::NotNumber;
  if (!std::isfinite(out)) return DoubleResult::NotFinite;
  return DoubleResult::Ok;
}

// Assigns YAML nodes to schema keys. `origin` says where the text came from
// ("cfg.yaml" or "--set model.d_model=abc"); marks are only meaningful for files.
class Loader {
 public:
  Loader(Config& c, std::string origin, bool marks_are_lines)
      : c_(c), origin_(std::move(origin)), lines_(marks_are_lines) {}

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& msg) const {
    throw ConfigError(where(m) + ": " + msg);
  }

  std::string where(const YAML::Mark& m) const {
    if (!lines_ || !mark_known(m)) return origin_;
    return origin_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
  }

  [[noreturn]] void unknown_key(const YAML::Mark& m, const std::string& path) const {
    const std::string parent = path.rfind('.') == std::string::npos ? "" : path.substr(0, path.rfind('.'));
    const bool top = parent.empty();
    std::string msg = std::string("unknown ") + (top ? "section" : "key") + " '" + path + "'";
    const std::string hint = suggest_key(path);
    if (!hint.empty()) {
      msg += "; did you mean '" + hint + "'?";
    } else if (is_section(parent)) {
      std::string keys;
      for (const auto& k : config_schema())
        if (k.parent() == parent) keys += (keys.empty() ? "" : ", ") + std::string(k.leaf());
      for (const auto& s : config_sections())
        if (s.rfind(parent + ".", 0) == 0 && s.find('.', parent.size() + 1) == std::string::npos)
          keys += (keys.empty() ? "" : ", ") + s.substr(parent.size() + 1);
      msg += " (keys in " + parent + ": " + keys + ")";
    } else {
      std::string secs;
      for (const auto& s : config_sections())
        if (s.find('.') == std::string::npos) secs += (secs.empty() ? "" : ", ") + s;
      msg += " (sections: " + secs + ")";
    }
    fail(m, msg);
  }

  // A map whose keys are relative to `prefix` ("" for the document root).
  void walk(const YAML::Node& map, const std::string& prefix) {
    std::map<std::string, int> here;  // key -> line, for duplicates in this map
    for (const auto& entry : map) {
      // Copies: the iterator yields a temporary pair, references would dangle.
      const YAML::Node kn = entry.first;
      const YAML::Node vn = entry.second;
      const YAML::Mark km = kn.Mark();
      if (!kn.IsScalar() || trim(kn.Scalar()).empty())
        fail(km, "keys must be plain names, got " + node_kind(kn) +
                     (prefix.empty() ? "" : " inside '" + prefix + "'"));
      const std::string name = trim(kn.Scalar());
      const std::string path = prefix.empty() ? name : prefix + "." + name;

      if (auto [pos, fresh] = here.emplace(name, km.line + 1); !fresh)
        fail(km, "invalid YAML: duplicate key '" + path + "' (first at line " +
                     std::to_string(pos->second) + ")");

      if (const KeySpec* k = find_key(path)) {
        // Dotted keys ("model.d_model: 64" at the top level) can collide with
        // the nested spelling of the same key, which the per-map check misses.
        if (auto [pos, fresh] = assigned_.emplace(path, km.line + 1); !fresh)
          fail(km, "invalid YAML: duplicate key '" + path + "' (first at line " +
                       std::to_string(pos->second) + ")");
        assign(*k, vn, km);
      } else if (is_section(path)) {
        if (vn.IsNull()) continue;  // a section with every key commented out
        if (!vn.IsMap())
          fail(km, "'" + path + "' is a section and takes a map of keys (e.g. '" + path + ":' then "
                   "indented 'key: value' lines), got " + node_kind(vn));
        walk(vn, path);
      } else {
        unknown_key(km, path);
      }
    }
  }

  // One value for one key. `km` locates the key, for values (like an empty
  // one) that have no useful position of their own.
  void assign(const KeySpec& k, const YAML::Node& v, const YAML::Mark& km) {
    const std::string key(k.path);
    const YAML::Mark vm = mark_known(v.Mark()) && !v.IsNull() ? v.Mark() : km;
    auto type_error = [&](const YAML::Node& n, const YAML::Mark& m, const std::string& suffix = "") {
      fail(m, key + ": expected " + type_phrase(k.type) + ", got " + node_kind(n) + suffix);
    };
    auto scalar = [&]() -> std::string {
      if (!v.IsScalar()) type_error(v, vm);
      return v.Scalar();
    };

    switch (k.type) {
      case KeyType::Int: {
        int x = 0;
        auto r = parse_integer(scalar(), x);
        if (r == IntResult::OutOfRange) type_error(v, vm, " (out of the 32-bit range)");
        if (r != IntResult::Ok) type_error(v, vm);
        std::get<int& (*)(Config&)>(k.field)(c_) = x;
        break;
      }
      case KeyType::Int64: {
        int64_t x = 0;
        auto r = parse_integer(scalar(), x);
        if (r == IntResult::OutOfRange) type_error(v, vm, " (out of the 64-bit range)");
        if (r != IntResult::Ok) type_error(v, vm);
        std::get<int64_t& (*)(Config&)>(k.field)(c_) = x;
        break;
      }
      case KeyType::UInt64: {
        uint64_t x = 0;
        auto r = parse_integer(scalar(), x);
        if (r != IntResult::Ok) type_error(v, vm);
        std::get<uint64_t& (*)(Config&)>(k.field)(c_) = x;
        break;
      }
      case KeyType::Double: {
        double x = 0;
        auto r = parse_number(scalar(), x);
        if (r == DoubleResult::NotFinite) fail(vm, key + ": must be a finite number, got " + node_kind(v));
        if (r != DoubleResult::Ok) type_error(v, vm);
        std::get<double& (*)(Config&)>(k.field)(c_) = x;
        break;
      }
      case KeyType::Bool: {
        bool x = false;
        if (!parse_bool(scalar(), x)) type_error(v, vm);
        std::get<bool& (*)(Config&)>(k.field)(c_) = x;
        break;
      }
      case KeyType::String: {
        std::string x;
        if (!v.IsNull()) x = scalar();
        // "tie_embeddings: yes" means the same as true; store the canonical word.
        bool b = false;
        if (k.choices.find("true") != std::string_view::npos && parse_bool(x, b)) x = b ? "true" : "false";
        std::get<std::string& (*)(Config&)>(k.field)(c_) = x;
        break;
      }
      case KeyType::StringList: {
        std::vector<std::string> xs;
        if (v.IsScalar()) {
          xs.push_back(v.Scalar());
        } else if (v.IsSequence()) {
          for (size_t i = 0; i < v.size(); ++i) {
            const YAML::Node item = v[i];
            if (!item.IsScalar())
              fail(mark_known(item.Mark()) && !item.IsNull() ? item.Mark() : vm,
                   key + "[" + std::to_string(i) + "]: expected a string (a file path), got " + node_kind(item));
            xs.push_back(item.Scalar());
          }
        } else if (!v.IsNull()) {
          type_error(v, vm);
        }
        std::get<std::vector<std::string>& (*)(Config&)>(k.field)(c_) = xs;
        break;
      }
      case KeyType::IntList: {
        std::vector<int> xs;
        if (v.IsSequence()) {
          for (size_t i = 0; i < v.size(); ++i) {
            const YAML::Node item = v[i];
            int x = 0;
            if (!item.IsScalar() || parse_integer(item.Scalar(), x) != IntResult::Ok)
              fail(mark_known(item.Mark()) && !item.IsNull() ? item.Mark() : vm,
                   key + "[" + std::to_string(i) + "]: expected an integer, got " + node_kind(item));
            xs.push_back(x);
          }
        } else if (!v.IsNull()) {
          type_error(v, vm);
        }
        std::get<std::vector<int>& (*)(Config&)>(k.field)(c_) = xs;
        break;
      }
    }
    if (auto problem = check_key_value(k, c_)) fail(vm, *problem);
    c_.given.insert(key);
  }

 private:
  Config& c_;
  std::string origin_;
  bool lines_;
  std::map<std::string, int> assigned_;
};

[[noreturn]] void rethrow_yaml(const std::string& origin, const YAML::Exception& e,
                               const std::string& text = "") {
  std::string where = origin;
  std::string hint;
  if (mark_known(e.mark)) {
    where += ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    // yaml-cpp reports a tab indent as "illegal map value" or similar; the
    // tab is the usual cause and invisible in most editors.
    std::istringstream lines(text);
    std::string line;
    for (int i = 0; std::getline(lines, line); ++i)
      if (i == e.mark.line || i == e.mark.line - 1)
        if (line.find('\t') != std::string::npos) hint = " (a tab character is used for indentation; YAML needs spaces)";
  }
  throw ConfigError(where + ": invalid YAML: " + (e.msg.empty() ? std::string("unreadable") : e.msg) + hint);
}

// How many documents the text holds, as YAML::LoadAll would return them.
// LoadAll itself is not called: yaml-cpp before 0.9 loops forever on a token
// no document can start with (a stray ','), adding a null document per turn
// until memory runs out (jbeder/yaml-cpp#1040, fixed upstream by #1319). A
// document that starts where the previous one did has consumed nothing.
size_t count_documents(const std::string& text, const std::string& source) {
  struct Starts final : YAML::EventHandler {
    std::vector<YAML::Mark> at;
    void OnDocumentStart(const YAML::Mark& m) override { at.push_back(m); }
    void OnDocumentEnd() override {}
    void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
    void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
    void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
    void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnSequenceEnd() override {}
    void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
    void OnMapEnd() override {}
  } starts;
  std::istringstream in(text);
  YAML::Parser parser(in);
  size_t n = 0;
  while (parser.HandleNextDocument(starts)) {
    ++n;
    const auto& at = starts.at;
    if (at.size() >= 2 && at.back().pos == at[at.size() - 2].pos) {
      const YAML::Mark& m = at.back();
      const char ch = m.pos >= 0 && size_t(m.pos) < text.size() ? text[size_t(m.pos)] : '?';
      throw ConfigError(source + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) +
                        ": invalid YAML: unexpected '" + std::string(1, ch) + "'");
    }
  }
  return n;
}

void apply_text(Config& c, const std::string& yaml, const std::string& source) {
  size_t documents = 0;
  YAML::Node root;
  try {
    documents = count_documents(yaml, source);
    if (documents == 1) root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    rethrow_yaml(source, e, yaml);
  }
  if (documents > 1)
    throw ConfigError(source + ": invalid YAML: holds " + std::to_string(documents) +
                      " documents (separated by '---'); a config is one document");
  if (documents == 0 || root.IsNull()) return;  // empty file: all defaults
  Loader loader(c, source, true);
  if (!root.IsMap()) {
    std::string secs;
    for (const auto& s : config_sections())
      if (s.find('.') == std::string::npos) secs += (secs.empty() ? "" : ", ") + s;
    loader.fail(root.Mark(), "the top level must be a map of sections (" + secs + "), got " + node_kind(root));
  }
  loader.walk(root, "");
}

void apply_override(Config& c, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos)
    throw ConfigError("--set " + quote(text) + ": expected KEY=VALUE (e.g. --set model.d_model=128)");
  const std::string key = trim(std::string_view(text).substr(0, eq));
  const std::string value = std::string(text.substr(eq + 1));
  const std::string origin = "--set " + text;
  if (key.empty()) throw ConfigError(origin + ": the key before '=' is empty (e.g. --set model.d_model=128)");

  Loader loader(c, origin, false);
  const KeySpec* k = find_key(key);
  if (!k && !is_section(key)) loader.unknown_key(YAML::Mark::null_mark(), key);

  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin + ": " + key + ": invalid YAML value: " + e.msg);
  }
  if (k) {
    loader.assign(*k, node, YAML::Mark::null_mark());
  } else if (node.IsMap()) {
    loader.walk(node, key);  // --set 'model.moe={num_experts: 4, top_k: 1}'
  } else {
    std::string example;
    for (const auto& s : config_schema())
      if (s.path.rfind(key + ".", 0) == 0) { example = std::string(s.path); break; }
    throw ConfigError(origin + ": '" + key + "' is a section; set one of its keys (e.g. --set " +
                      example + "=...) or give a map (--set '" + key + "={key: value}')");
  }
}

}  // namespace

Config parse_config_keys(const std::string& yaml, const std::string& source) {
  Config c;
  c.source = source;
  try {
    apply_text(c, yaml, source);
  } catch (const YAML::Exception& e) {
    rethrow_yaml(source, e, yaml);
  }
  return c;
}

Config load_config_text(const std::string& yaml, const std::string& source,
                        const std::vector<std::string>& overrides, int world_size, const ConfigFill& before_resolve) {
  Config c;
  c.source = source;
  try {
    apply_text(c, yaml, source);
    for (const auto& o : overrides) apply_override(c, o);
    apply_hardware_calibration(c);
    if (before_resolve) before_resolve(c);
    // 0: the layout the configuration itself describes (tools that launch nothing).
    if (world_size == 0) {
      const auto& p = c.parallel;
      world_size = p.tp * p.pp * p.cp * (p.dp > 0 ? p.dp : 1);
    }
    resolve_config(c, world_size);
    validate_config(c, world_size);
  } catch (const ConfigError&) {
    throw;
  } catch (const YAML::Exception& e) {
    rethrow_yaml(source, e);
  } catch (const std::exception& e) {
    // Not a user mistake we foresaw; still one line with the file, not a crash.
    throw ConfigError(source + ": could not read the configuration: " + e.what());
  }
  return c;
}

Config load_config_file(const std::string& path, const std::vector<std::string>& overrides, int world_size,
                        const ConfigFill& before_resolve) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw ConfigError("config file '" + path + "' does not exist");
  if (fs::is_directory(st))
    throw ConfigError("config file '" + path + "' is a directory, not a YAML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot open config file '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError("cannot read config file '" + path + "': " + std::strerror(errno));
  return load_config_text(text.str(), path, overrides, world_size, before_resolve);
}

}  // namespace trainer
