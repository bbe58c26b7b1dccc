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

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > INT64_MAX / d) return std::nullopt;
    n *= d;
  }
  return n;
}

std::string check_slice_cover(const std::vector<int64_t>& global_shape, const std::vector<SliceBox>& slices) {
  const size_t nd = global_shape.size();
  const auto total = checked_numel(global_shape);
  if (!total) return "invalid global shape " + shape_str(global_shape);
  int64_t covered = 0;
  for (size_t i = 0; i < slices.size(); ++i) {
    const SliceBox& s = slices[i];
    if (s.offset.size() != nd || s.shape.size() != nd)
      return "slice " + std::to_string(i) + " has " + std::to_string(s.shape.size()) + " dimensions, the tensor " +
             std::to_string(nd);
    for (size_t d = 0; d < nd; ++d)
      if (s.offset[d] < 0 || s.shape[d] < 0 || s.offset[d] > global_shape[d] - s.shape[d])
        return "slice " + std::to_string(i) + " at " + shape_str(s.offset) + " of shape " + shape_str(s.shape) +
               " lies outside the global shape " + shape_str(global_shape);
    covered += *checked_numel(s.shape);
    // Boxes overlap iff their ranges intersect in every dimension. Empty
    // slices hold nothing and cannot overlap.
    for (size_t j = 0; j < i; ++j) {
      const SliceBox& o = slices[j];
      bool overlap = true;
      for (size_t d = 0; d < nd && overlap; ++d)
        overlap = s.offset[d] < o.offset[d] + o.shape[d] && o.offset[d] < s.offset[d] + s.shape[d];
      if (overlap && *checked_numel(s.shape) > 0 && *checked_numel(o.shape) > 0)
        return "slices " + std::to_string(j) + " and " + std::to_string(i) + " overlap";
    }
  }
  // Disjoint boxes inside the tensor cover it exactly when their sizes add up.
  if (covered != *total)
    return "slices hold " + std::to_string(covered) + " of the " + std::to_string(*total) + " elements";
  return "";
}

}  // namespace ckpt_detail
}  // namespace trainer
