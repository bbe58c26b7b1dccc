// Reading an earlier output and comparing it with this run's, probe by probe,
// under the rule the probe's name carries (probe_inputs.cpp's list).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "tests/ptx_probe/probe.h"

namespace ptx_probe {
namespace {

float as_float(uint32_t u) { return std::bit_cast<float>(u); }

// The position of a float among the values an .ftz result can take (no
// subnormals): 0 and the smallest normal are neighbours, so a result flushed
// to zero on one side and rounded up to 2^-126 on the other is 1 apart.
int64_t ftz_index(uint32_t u) {
  const uint32_t mag = u & 0x7FFFFFFFu;
  const int64_t i = mag < 0x00800000u ? 0 : int64_t(mag) - 0x007FFFFF;
  return u >> 31 ? -i : i;
}

// One value's difference under the rule, and whether it is within it.
struct Diff {
  double amount;
  bool ok;
  std::string note;
};

Diff exact_diff(uint32_t a, uint32_t b) {
  const int n = std::popcount(a ^ b);
  return {double(n), n == 0, ""};
}

Diff mma_diff(const std::string& probe, uint32_t index, uint32_t a, uint32_t b) {
  const float x = as_float(a), y = as_float(b);
  const double scale = mma_scale(probe, index);
  char note[96];
  std::snprintf(note, sizeof note, ", sum |a*b| + |c| = %.6g", scale);
  if (std::isnan(x) || std::isnan(y)) {
    const bool both = std::isnan(x) && std::isnan(y);
    return {both ? 0 : std::numeric_limits<double>::infinity(), both, note};
  }
  const double d = std::fabs(double(x) - double(y));
  if (scale == 0) return {d == 0 ? 0 : std::numeric_limits<double>::infinity(), d == 0, note};
  return {d / scale, d <= kMmaRelTol * scale, note};
}

Diff ex2_diff(uint32_t index, uint32_t a, uint32_t b, int64_t ulp_bound) {
  static const std::vector<float> inputs = ex2_inputs();
  if (index >= inputs.size()) return {std::numeric_limits<double>::infinity(), false, ", no such input"};
  const float x = inputs[index];
  char note[64];
  std::snprintf(note, sizeof note, ", 2^(%.9g)", x);
  const bool nan_a = std::isnan(as_float(a)), nan_b = std::isnan(as_float(b));
  if (nan_a || nan_b) return {nan_a && nan_b ? 0 : std::numeric_limits<double>::infinity(), nan_a && nan_b, note};
  const double ulp = double(std::llabs(ftz_index(a) - ftz_index(b)));
  // Zeros, infinities and subnormal inputs have one right answer.
  if (ex2_special_input(x)) return {ulp, a == b, note};
  return {ulp, ulp <= double(ulp_bound), note};
}

std::string rule_text(const ProbeInfo& info, int64_t ulp_bound) {
  char text[160];
  switch (info.rule) {
    case Rule::kExact: return "bit for bit";
    case Rule::kMmaTol:
      std::snprintf(text, sizeof text, "|x - y| <= %g * (sum |a*b| + |c|)", kMmaRelTol);
      return text;
    case Rule::kEx2Ulp:
      std::snprintf(text, sizeof text, "%lld ulp, counting 0 next to 2^-126; 0, inf, NaN, subnormal inputs exact",
                    static_cast<long long>(ulp_bound));
      return text;
  }
  return "?";
}

std::string describe(uint32_t index, const uint32_t* a, const uint32_t* b, const std::string& note) {
  auto one = [](const uint32_t* v) {
    if (!v) return std::string("(none)");
    char text[48];
    std::snprintf(text, sizeof text, "%08x (%.9g)", *v, double(as_float(*v)));
    return std::string(text);
  };
  return "index " + std::to_string(index) + ": " + one(a) + " vs " + one(b) + note;
}

}  // namespace

bool read_table(const std::string& path, Table& t, std::string& error) {
  std::ifstream in(path);
  if (!in) {
    error = "cannot read " + path;
    return false;
  }
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, index, hex, extra;
    fields >> name >> index >> hex;
    const bool shaped = !hex.empty() && !(fields >> extra) && hex.size() <= 8 &&
                        index.find_first_not_of("0123456789") == std::string::npos && index.size() <= 9 &&
                        hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos;
    if (!shaped) {
      error = path + ":" + std::to_string(n) + ": not '<probe> <index> <hex bits>': " + line;
      return false;
    }
    if (!t[name].emplace(uint32_t(std::stoul(index)), uint32_t(std::stoul(hex, nullptr, 16))).second) {
      error = path + ":" + std::to_string(n) + ": " + name + " " + index + " appears twice";
      return false;
    }
  }
  return true;
}

Verdict compare_probe(const ProbeInfo& info, const Values& got, const Values& want, int64_t ulp_bound) {
  Verdict v;
  v.rule = rule_text(info, ulp_bound);
  v.unit = info.rule == Rule::kExact ? "bits" : info.rule == Rule::kEx2Ulp ? "ulp" : "of sum |a*b| + |c|";
  std::set<uint32_t> indices;
  for (const auto& kv : got) indices.insert(kv.first);
  for (const auto& kv : want) indices.insert(kv.first);
  for (uint32_t index : indices) {
    const auto g = got.find(index), w = want.find(index);
    const uint32_t* a = g == got.end() ? nullptr : &g->second;
    const uint32_t* b = w == want.end() ? nullptr : &w->second;
    Diff d{std::numeric_limits<double>::infinity(), false, ", present on one side only"};
    if (a && b) {
      if (info.rule == Rule::kExact) d = exact_diff(*a, *b);
      else if (info.rule == Rule::kMmaTol) d = mma_diff(info.name, index, *a, *b);
      else d = ex2_diff(index, *a, *b, ulp_bound);
    }
    ++v.values;
    if (d.amount > v.max_diff) v.max_diff = d.amount;
    if (d.ok) continue;
    if (++v.bad <= 5) v.first_bad.push_back(describe(index, a, b, d.note));
  }
  return v;
}

bool compare_tables(const Table& got, const Table& want, const std::string& want_name, std::string& out) {
  std::vector<std::string> names;
  for (const ProbeInfo& p : probes()) names.push_back(p.name);
  for (const Table* t : {&got, &want})
    for (const auto& kv : *t)
      if (!find_probe(kv.first) && std::find(names.begin(), names.end(), kv.first) == names.end())
        names.push_back(kv.first);
  std::vector<std::string> bad;
  char line[512];
  for (const std::string& name : names) {
    const ProbeInfo* info = find_probe(name);
    const bool in_got = got.count(name) != 0, in_want = want.count(name) != 0;
    if (!info || !in_got || !in_want) {
      std::string why = "missing from " + (in_got ? want_name : std::string("this run"));
      if (!info) why = "not a probe of this program (in " + (in_got ? std::string("this run") : want_name) + ")";
      out += "probe " + name + ": " + why + ": MISMATCH\n";
      bad.push_back(name);
      continue;
    }
    const Verdict v = compare_probe(*info, got.at(name), want.at(name), kEx2UlpBetweenBuilds);
    std::snprintf(line, sizeof line, "probe %s: %zu values, max difference %.3g %s (rule %s): %s\n", name.c_str(),
                  v.values, v.max_diff, v.unit.c_str(), v.rule.c_str(), v.bad ? "MISMATCH" : "ok");
    out += line;
    if (v.bad) {
      out += "  " + std::to_string(v.bad) + " values differ; the first (this run vs " + want_name + "):\n";
      for (const std::string& s : v.first_bad) out += "  " + s + "\n";
      bad.push_back(name);
    }
  }
  out += "ptx_probe --expect " + want_name + ": ";
  if (bad.empty()) return out += "ok, all " + std::to_string(names.size()) + " probes agree\n", true;
  out += "MISMATCH in " + std::to_string(bad.size()) + " probe(s):";
  for (const std::string& n : bad) out += " " + n;
  out += "\n";
  return false;
}

}  // namespace ptx_probe
