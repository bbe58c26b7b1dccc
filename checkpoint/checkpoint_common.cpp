#include <charconv>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"

namespace trainer {

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

namespace ckpt_detail {

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view prefix = "step_";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.empty()) return std::nullopt;
  for (char c : digits)
    if (c < '0' || c > '9') return std::nullopt;
  int64_t step = 0;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::string rank_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

}  // namespace ckpt_detail
}  // namespace trainer
