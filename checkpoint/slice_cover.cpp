// Whether the pieces of a tensor hold each of its elements exactly once:
// rank 0 checks it before publishing a checkpoint and every reader checks it
// again, because any later layout must be assemblable from what was saved.
#include <algorithm>

#include "checkpoint/slice.h"

namespace trainer {

namespace {

// "[2, 5]": the N-d index of a row-major flat index.
std::string index_text(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] > 0 ? flat % shape[d] : 0;
    flat = shape[d] > 0 ? flat / shape[d] : 0;
  }
  return shape_text(idx);
}

struct Run {
  int64_t begin, end;  // global row-major element indices
  size_t piece;
};

}  // namespace

std::string cover_error(const std::vector<int64_t>& global_shape,
                        const std::vector<std::pair<std::string, SliceSpec>>& pieces) {
  const SliceSpec whole = SliceSpec::whole(global_shape);
  if (std::string bad = slice_error(whole); !bad.empty()) return bad;
  // Every piece as runs of global element indices: one run for a flat range
  // of a contiguous box, a run per row for a box split along a later
  // dimension. Sorted, they must follow each other without gap or overlap.
  std::vector<Run> runs;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& [who, s] = pieces[i];
    if (s.global_shape != global_shape)
      return who + " has global shape " + shape_text(s.global_shape) + ", not " + shape_text(global_shape);
    if (std::string bad = slice_error(s); !bad.empty()) return who + ": " + bad;
    for_each_common_run(s, whole, [&](int64_t, int64_t g, int64_t n) {
      runs.push_back(Run{g, g + n, i});
      return true;
    });
  }
  // Ties in piece order, so that a message names the pieces in their order.
  std::sort(runs.begin(), runs.end(),
            [](const Run& a, const Run& b) { return a.begin != b.begin ? a.begin < b.begin : a.piece < b.piece; });
  const int64_t total = whole.numel();
  int64_t covered = 0;        // every index below is held exactly once
  size_t last = SIZE_MAX;     // the piece holding index covered - 1
  for (const Run& r : runs) {
    if (r.begin < covered)
      return pieces[last].first + " and " + pieces[r.piece].first + " both hold element " +
             index_text(global_shape, r.begin);
    if (r.begin > covered)
      return "no piece holds elements " + index_text(global_shape, covered) + " to " +
             index_text(global_shape, r.begin - 1) + " (" + std::to_string(r.begin - covered) + " of " +
             std::to_string(total) + ")";
    covered = r.end;
    last = r.piece;
  }
  if (covered < total)
    return "no piece holds elements " + index_text(global_shape, covered) + " to " +
           index_text(global_shape, total - 1) + " (" + std::to_string(total - covered) + " of " +
           std::to_string(total) + ")";
  return "";
}

}  // namespace trainer
