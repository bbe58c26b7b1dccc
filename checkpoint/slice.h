// Which elements of a global tensor a checkpoint piece holds.
//
// A parallel layout gives a rank an N-d box of each global tensor it holds:
// tensor parallelism a block of rows or columns, expert parallelism a range
// of experts of a stacked [E, ...] weight, a pipeline stage the whole tensors
// of its layers (and none of the others). ZeRO then shards a flat element
// range of that box. A SliceSpec says exactly that, always against the real
// N-d global shape, so that a checkpoint saved in one layout can be assembled
// into any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainer {

// Elements [begin, end) of a box, counted in the box's row-major order.
struct FlatRange {
  int64_t begin = 0, end = 0;
  bool operator==(const FlatRange&) const = default;
};

struct SliceSpec {
  std::vector<int64_t> global_shape;  // the whole tensor, N-d (never flattened)
  std::vector<int64_t> box_offset;    // where the box starts in each dimension
  std::vector<int64_t> box_shape;     // the box's extent in each dimension
  std::optional<FlatRange> flat;      // the part of the box held; absent: all of it

  // The whole tensor.
  static SliceSpec whole(std::vector<int64_t> global_shape);
  // A box of the tensor, all of it.
  static SliceSpec box(std::vector<int64_t> global_shape, std::vector<int64_t> offset, std::vector<int64_t> shape);
  // This box, elements [begin, end) of it only (a ZeRO piece of the box).
  SliceSpec flat_range(int64_t begin, int64_t end) const;

  int64_t box_numel() const;
  // Elements held: a piece's data holds this many, in the box's row-major
  // order (from flat->begin when there is a flat range).
  int64_t numel() const;
  // The shape a rank file stores the data under: the box's shape, or
  // [numel] for a flat range (which is not a box).
  std::vector<int64_t> stored_shape() const;
  // Every element of the tensor (a flat range covering the whole box counts).
  bool is_whole() const;

  bool operator==(const SliceSpec&) const = default;
};

// Empty when `s` is consistent (box and global shape of equal rank, box
// inside the tensor, flat range inside the box, no overflow); else what is
// wrong, in words.
std::string slice_error(const SliceSpec& s);

// "whole", "[0:4, 0:6]", "flat [10, 24)" (a flat range of the whole tensor),
// "[0:4, 0:6] flat [10, 24)".
std::string describe_slice(const SliceSpec& s);

// "[2, 0, 3]"
std::string shape_text(const std::vector<int64_t>& shape);

// Calls fn(src_index, dst_index, count) for each run of elements held by both
// slices, with the indices counted in elements from the start of each
// slice's data; runs come in increasing order and are as long as the two
// layouts allow (whole rows of the common box, longer where the boxes are
// contiguous in both). fn returns false to stop early. Both slices must be
// valid (slice_error empty) with the same global shape; the cost is one
// call per run plus a logarithmic search, never one per element.
using RunVisitor = std::function<bool(int64_t src_index, int64_t dst_index, int64_t count)>;
void for_each_common_run(const SliceSpec& src, const SliceSpec& dst, const RunVisitor& fn);

// Whether the two slices share at least one element.
bool slices_overlap(const SliceSpec& a, const SliceSpec& b);

// Copies the elements both slices hold from src_data (src.numel() elements
// of elem_size bytes) to their places in dst_data (dst.numel() elements);
// returns how many. Elements dst holds and src does not are left untouched.
int64_t copy_common_elements(const SliceSpec& src, const void* src_data, const SliceSpec& dst, void* dst_data,
                             size_t elem_size);

// Empty when the pieces (each named for messages, e.g. "rank 3") are valid,
// lie in a tensor of `global_shape` and hold every element of it exactly
// once; otherwise the first problem: a bad piece, two pieces holding the
// same element, or elements no piece holds (with their global index).
std::string cover_error(const std::vector<int64_t>& global_shape,
                        const std::vector<std::pair<std::string, SliceSpec>>& pieces);

}  // namespace trainer
