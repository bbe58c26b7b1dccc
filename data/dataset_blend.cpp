#include "data/dataset_blend.h"

#include <glob.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <stdexcept>

#include "data/token_file.h"

namespace trainer {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

bool names_dataset(const std::string& p) { return exists(p) || !megatron_prefix(p).empty(); }

// Whole-string number parse: "3", "0.25", "1e-3".
bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  *out = v;
  return true;
}

bool looks_numeric(const std::string& w) {
  const char c = w.empty() ? '\0' : w[0];
  return (c >= '0' && c <= '9') || c == '.' || c == '+' || c == '-';
}

bool has_glob_chars(const std::string& p) { return p.find_first_of("*?[") != std::string::npos; }

}  // namespace

DataEntry parse_data_entry(const std::string& text, const std::string& key) {
  const std::string t = trim(text);
  if (t.empty()) throw std::runtime_error(key + " is an empty path");
  DataEntry e;
  if (names_dataset(t)) {
    e.pattern = t;
    return e;
  }
  const size_t sp = t.find_first_of(" \t");
  if (sp == std::string::npos) {
    double w;
    if (parse_number(t, &w))
      throw std::runtime_error(key + "='" + t +
                               "' is a weight without a path: write the weight and the path in one entry, "
                               "e.g. '" + t + " data/train.bin'");
    e.pattern = t;
    return e;
  }
  const std::string word = t.substr(0, sp);
  if (!looks_numeric(word)) {  // a path with a space in it
    e.pattern = t;
    return e;
  }
  double w;
  if (!parse_number(word, &w) || !std::isfinite(w))
    throw std::runtime_error(key + "='" + t + "': cannot parse the weight '" + word +
                             "' (an entry is 'PATH' or 'WEIGHT PATH' with a positive number)");
  if (w <= 0)
    throw std::runtime_error(key + "='" + t + "': the weight must be > 0, got " + word);
  e.weight = w;
  e.pattern = trim(t.substr(sp));
  return e;
}

std::vector<std::string> expand_data_entry(const DataEntry& e, const std::string& text, const std::string& key,
                                           const std::string& format) {
  std::vector<std::string> matches;
  if (has_glob_chars(e.pattern) && !names_dataset(e.pattern)) {
    glob_t g{};
    const int rc = ::glob(e.pattern.c_str(), GLOB_ERR, nullptr, &g);
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc == GLOB_NOMATCH || (rc == 0 && matches.empty()))
      throw std::runtime_error(key + "='" + trim(text) + "': the pattern '" + e.pattern + "' matches no files");
    if (rc != 0) throw std::runtime_error(key + "='" + trim(text) + "': cannot expand '" + e.pattern + "' (read error)");
  } else {
    // An unweighted entry with a space that is not a file is most likely a
    // mistyped weight ("x2 a.bin"); say how weights are written.
    if (e.pattern == trim(text) && e.pattern.find_first_of(" \t") != std::string::npos && !names_dataset(e.pattern))
      throw std::runtime_error(key + "='" + trim(text) +
                               "': no such file (to weight an entry, start it with a positive number: "
                               "'WEIGHT PATH')");
    return {e.pattern};
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  const bool megatron_aware = format == "auto" || format == "megatron" || format.empty();
  for (const auto& m : matches) {
    struct stat st {};
    if (::stat(m.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    std::string id = m;
    if (megatron_aware) {
      const std::string prefix = megatron_prefix(m);
      if (!prefix.empty()) id = prefix;
    }
    if (seen.insert(id).second) out.push_back(id);
  }
  if (out.empty())
    throw std::runtime_error(key + "='" + trim(text) + "': the pattern '" + e.pattern + "' matches only directories");
  return out;
}

}  // namespace trainer
