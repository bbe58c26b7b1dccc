#include "checkpoint/slice.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace trainer {

namespace {

// Product of the dimensions; nullopt on a negative dimension or overflow.
std::optional<int64_t> product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > INT64_MAX / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// One dimension of the common box after merging: its extent, the extents of
// the two boxes, and where the common box starts inside each.
struct Dim {
  int64_t len, src_ext, dst_ext, src_off, dst_off;
};

// The common box of two boxes of one tensor, with adjacent dimensions merged
// wherever the inner one is covered completely in both boxes (then stepping
// the outer one moves contiguously in both). Empty when the boxes are
// disjoint or one is empty. A 0-d tensor yields one dimension of extent 1.
std::vector<Dim> common_dims(const SliceSpec& a, const SliceSpec& b) {
  const size_t nd = a.global_shape.size();
  std::vector<Dim> dims;  // innermost first while building
  for (size_t i = nd; i-- > 0;) {
    const int64_t lo = std::max(a.box_offset[i], b.box_offset[i]);
    const int64_t hi = std::min(a.box_offset[i] + a.box_shape[i], b.box_offset[i] + b.box_shape[i]);
    if (hi <= lo) return {};
    Dim d{hi - lo, a.box_shape[i], b.box_shape[i], lo - a.box_offset[i], lo - b.box_offset[i]};
    if (!dims.empty()) {
      Dim& in = dims.back();
      if (in.len == in.src_ext && in.len == in.dst_ext) {
        // The inner block is whole in both boxes, so its offsets are 0.
        in = Dim{d.len * in.len, d.src_ext * in.src_ext, d.dst_ext * in.dst_ext, d.src_off * in.src_ext,
                 d.dst_off * in.dst_ext};
        continue;
      }
    }
    dims.push_back(d);
  }
  if (nd == 0) dims.push_back(Dim{1, 1, 1, 0, 0});
  std::reverse(dims.begin(), dims.end());
  return dims;
}

FlatRange held_range(const SliceSpec& s) { return s.flat ? *s.flat : FlatRange{0, s.box_numel()}; }

}  // namespace

SliceSpec SliceSpec::whole(std::vector<int64_t> global_shape) {
  SliceSpec s;
  s.box_offset.assign(global_shape.size(), 0);
  s.box_shape = global_shape;
  s.global_shape = std::move(global_shape);
  return s;
}

SliceSpec SliceSpec::box(std::vector<int64_t> global_shape, std::vector<int64_t> offset, std::vector<int64_t> shape) {
  SliceSpec s;
  s.global_shape = std::move(global_shape);
  s.box_offset = std::move(offset);
  s.box_shape = std::move(shape);
  return s;
}

SliceSpec SliceSpec::flat_range(int64_t begin, int64_t end) const {
  SliceSpec s = *this;
  s.flat = FlatRange{begin, end};
  return s;
}

int64_t SliceSpec::box_numel() const { return product(box_shape).value_or(0); }

int64_t SliceSpec::numel() const { return flat ? flat->end - flat->begin : box_numel(); }

std::vector<int64_t> SliceSpec::stored_shape() const { return flat ? std::vector<int64_t>{numel()} : box_shape; }

bool SliceSpec::is_whole() const {
  return box_offset == std::vector<int64_t>(global_shape.size(), 0) && box_shape == global_shape &&
         (!flat || (flat->begin == 0 && flat->end == box_numel()));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string slice_error(const SliceSpec& s) {
  const size_t nd = s.global_shape.size();
  if (!product(s.global_shape)) return "invalid global shape " + shape_text(s.global_shape);
  if (s.box_offset.size() != nd || s.box_shape.size() != nd)
    return "box offset " + shape_text(s.box_offset) + " and shape " + shape_text(s.box_shape) + " do not have the " +
           std::to_string(nd) + " dimensions of the global shape " + shape_text(s.global_shape);
  for (size_t d = 0; d < nd; ++d)
    if (s.box_offset[d] < 0 || s.box_shape[d] < 0 || s.box_offset[d] > s.global_shape[d] - s.box_shape[d])
      return "box at " + shape_text(s.box_offset) + " of shape " + shape_text(s.box_shape) +
             " does not fit in the global shape " + shape_text(s.global_shape);
  if (s.flat && (s.flat->begin < 0 || s.flat->begin > s.flat->end || s.flat->end > s.box_numel()))
    return "flat range [" + std::to_string(s.flat->begin) + ", " + std::to_string(s.flat->end) +
           ") does not fit in the box's " + std::to_string(s.box_numel()) + " elements";
  return "";
}

std::string describe_slice(const SliceSpec& s) {
  std::ostringstream o;
  const bool whole_box = s.box_offset == std::vector<int64_t>(s.global_shape.size(), 0) && s.box_shape == s.global_shape;
  if (!whole_box) {
    o << "[";
    for (size_t d = 0; d < s.box_shape.size(); ++d)
      o << (d ? ", " : "") << s.box_offset[d] << ":" << s.box_offset[d] + s.box_shape[d];
    o << "]";
  }
  if (s.flat && !s.is_whole()) o << (whole_box ? "" : " ") << "flat [" << s.flat->begin << ", " << s.flat->end << ")";
  const std::string out = o.str();
  return out.empty() ? "whole" : out;
}

void for_each_common_run(const SliceSpec& src, const SliceSpec& dst, const RunVisitor& fn) {
  const std::vector<Dim> dims = common_dims(src, dst);
  if (dims.empty()) return;
  const size_t k = dims.size();
  const int64_t run = dims[k - 1].len;
  // Box strides of every merged dimension, in elements.
  std::vector<int64_t> sstride(k, 1), dstride(k, 1);
  for (size_t i = k - 1; i-- > 0;) {
    sstride[i] = sstride[i + 1] * dims[i + 1].src_ext;
    dstride[i] = dstride[i + 1] * dims[i + 1].dst_ext;
  }
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < k; ++i) rows *= dims[i].len;

  // Where row r of the common box starts inside each box (row-major box
  // index). Both grow with r, which the searches below rely on.
  std::vector<int64_t> idx(k, 0);
  auto decode = [&](int64_t r) {
    for (size_t i = k - 1; i-- > 0;) {
      idx[i] = r % dims[i].len;
      r /= dims[i].len;
    }
  };
  auto starts = [&](int64_t* s0, int64_t* d0) {
    *s0 = dims[k - 1].src_off;
    *d0 = dims[k - 1].dst_off;
    for (size_t i = 0; i + 1 < k; ++i) {
      *s0 += (dims[i].src_off + idx[i]) * sstride[i];
      *d0 += (dims[i].dst_off + idx[i]) * dstride[i];
    }
  };
  const FlatRange sr = held_range(src), dr = held_range(dst);
  if (sr.begin >= sr.end || dr.begin >= dr.end) return;
  // First row that reaches into both held ranges, first row past either.
  auto first_row = [&](auto&& pred) {
    int64_t lo = 0, hi = rows;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      int64_t s0, d0;
      decode(mid);
      starts(&s0, &d0);
      if (pred(s0, d0)) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  };
  const int64_t r_lo = first_row([&](int64_t s0, int64_t d0) { return s0 + run > sr.begin && d0 + run > dr.begin; });
  const int64_t r_hi = first_row([&](int64_t s0, int64_t d0) { return s0 >= sr.end || d0 >= dr.end; });

  // Runs that continue the previous one in both slices are joined.
  int64_t ps = 0, pd = 0, pn = 0;
  decode(r_lo);
  for (int64_t r = r_lo; r < r_hi; ++r) {
    int64_t s0, d0;
    starts(&s0, &d0);
    const int64_t kb = std::max({int64_t(0), sr.begin - s0, dr.begin - d0});
    const int64_t ke = std::min({run, sr.end - s0, dr.end - d0});
    if (kb < ke) {
      const int64_t si = s0 + kb - sr.begin, di = d0 + kb - dr.begin;
      if (pn > 0 && si == ps + pn && di == pd + pn) {
        pn += ke - kb;
      } else {
        if (pn > 0 && !fn(ps, pd, pn)) return;
        ps = si, pd = di, pn = ke - kb;
      }
    }
    for (size_t i = k - 1; i-- > 0;) {  // odometer over the outer dimensions
      if (++idx[i] < dims[i].len) break;
      idx[i] = 0;
    }
  }
  if (pn > 0) fn(ps, pd, pn);
}

bool slices_overlap(const SliceSpec& a, const SliceSpec& b) {
  bool any = false;
  for_each_common_run(a, b, [&](int64_t, int64_t, int64_t) {
    any = true;
    return false;
  });
  return any;
}

int64_t copy_common_elements(const SliceSpec& src, const void* src_data, const SliceSpec& dst, void* dst_data,
                             size_t elem_size) {
  const char* s = static_cast<const char*>(src_data);
  char* d = static_cast<char*>(dst_data);
  const int64_t es = int64_t(elem_size);
  int64_t copied = 0;
  for_each_common_run(src, dst, [&](int64_t si, int64_t di, int64_t n) {
    std::memcpy(d + di * es, s + si * es, size_t(n * es));
    copied += n;
    return true;
  });
  return copied;
}

}  // namespace trainer
