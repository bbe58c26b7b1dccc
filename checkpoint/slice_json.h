// How a piece's place in its tensor is spelled in the manifest and in the
// save reports of the multi-rank protocol (one spelling for both):
//   "box_offset": [0, 2], "box_shape": [8, 2], "flat_range": [4, 12]
// with "flat_range" present only when the piece is part of its box. The
// global shape is written by the caller (once per tensor in the manifest).
// Not part of the checkpoint API.
#pragma once

#include <vector>

#include "checkpoint/slice.h"
#include "checkpoint/strict_json.h"

namespace trainer::ckpt_detail {

void put_slice(json::Value& object, const SliceSpec& s);

// The slice `object` describes in a tensor of `global_shape`; throws
// json::TypeError when a key is missing or malformed or the slice does not
// fit (slice_error).
SliceSpec get_slice(const json::Value& object, const std::vector<int64_t>& global_shape);

}  // namespace trainer::ckpt_detail
