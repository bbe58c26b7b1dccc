// Reading a checkpoint into another layout: which saved pieces a rank needs,
// and how its own pieces are put together from them.
#include <memory>
#include <stdexcept>

#include "checkpoint/checkpoint.h"

namespace trainer {

SliceFilter overlapping(const std::vector<std::pair<std::string, SliceSpec>>& wanted) {
  auto index = std::make_shared<std::unordered_multimap<std::string, SliceSpec>>(wanted.begin(), wanted.end());
  return [index](const std::string& name, const SliceSpec& saved) {
    const auto [lo, hi] = index->equal_range(name);
    for (auto it = lo; it != hi; ++it) {
      // A tensor whose shape changed is loaded anyway, so that assembling it
      // fails with both shapes instead of "not loaded".
      if (it->second.global_shape != saved.global_shape) return true;
      if (slices_overlap(saved, it->second)) return true;
    }
    return false;
  };
}

int64_t copy_overlap(const ShardTensor& src, const SliceSpec& dst_slice, void* dst) {
  const std::string where = "copy_overlap: tensor \"" + src.name + "\": ";
  if (std::string bad = slice_error(src.slice); !bad.empty()) throw std::invalid_argument(where + bad);
  if (std::string bad = slice_error(dst_slice); !bad.empty())
    throw std::invalid_argument(where + "destination: " + bad);
  const uint64_t need = uint64_t(src.slice.numel()) * dtype_size(src.dtype);
  if (src.data.size() != need)
    throw std::invalid_argument(where + "data holds " + std::to_string(src.data.size()) + " bytes, " +
                                describe_slice(src.slice) + " of " + dtype_name(src.dtype) + " needs " +
                                std::to_string(need));
  if (src.slice.global_shape != dst_slice.global_shape)
    throw std::invalid_argument(where + "global shape " + shape_text(src.slice.global_shape) +
                                ", the destination's " + shape_text(dst_slice.global_shape));
  return copy_common_elements(src.slice, src.data.data(), dst_slice, dst, dtype_size(src.dtype));
}

SliceAssembler::SliceAssembler(const LoadedCheckpoint& ck) : ck_(ck) {
  for (const ShardTensor& t : ck.tensors) by_name_.emplace(t.name, &t);
}

bool SliceAssembler::has(const std::string& name) const { return by_name_.count(name) > 0; }

void SliceAssembler::fill(const std::string& name, DType dtype, const SliceSpec& want, void* dst) const {
  const std::string where = ck_.dir + ": tensor \"" + name + "\"";
  const auto [lo, hi] = by_name_.equal_range(name);
  if (lo == hi)
    throw std::runtime_error(ck_.dir + ": checkpoint has no tensor \"" + name +
                             "\" (was it saved from a different model configuration?)");
  if (std::string bad = slice_error(want); !bad.empty())
    throw std::invalid_argument(where + ": the wanted piece is invalid: " + bad);
  int64_t copied = 0;
  for (auto it = lo; it != hi; ++it) {
    const ShardTensor& src = *it->second;
    if (src.dtype != dtype || src.slice.global_shape != want.global_shape)
      throw std::runtime_error(where + " is " + dtype_name(src.dtype) + " " + shape_text(src.slice.global_shape) +
                               " in the checkpoint, " + dtype_name(dtype) + " " + shape_text(want.global_shape) +
                               " here (was it saved from a different model configuration?)");
    copied += copy_overlap(src, want, dst);
  }
  if (copied != want.numel())
    throw std::runtime_error(where + ": the loaded pieces hold " + std::to_string(copied) + " of the " +
                             std::to_string(want.numel()) + " elements of " + describe_slice(want) +
                             " wanted here (not loaded: was the load filter too narrow?)");
}

}  // namespace trainer
