// Helpers of the argument checks: every check throws
// std::invalid_argument("<op>: <what>"), naming the op, the argument and its
// shape, so a bad call says which tensor was wrong and how.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/tensor.h"

namespace trainer::checks {

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// "<an> [shape] <rel> <bn> [shape]", the message of every pairwise check.
[[noreturn]] inline void mismatch(const char* op, const char* an, const Tensor& a, const char* rel,
                                  const char* bn, const Tensor& b) {
  fail(op, std::string(an) + " " + a.shape_str() + rel + bn + " " + b.shape_str());
}

inline bool is_float(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// A tensor with elements has data. One without elements may have none (an
// expert or a rank can get zero rows); nothing is read or written then.
inline void present(const char* op, const char* name, const Tensor& t) {
  if (t.data == nullptr && t.numel() > 0) fail(op, std::string(name) + " " + t.shape_str() + " is missing");
}

// Present, with dtype dt.
inline void need(const char* op, const char* name, const Tensor& t, DType dt) {
  present(op, name, t);
  if (t.dtype != dt)
    fail(op, std::string(name) + " " + t.shape_str() + " is " + dtype_name(t.dtype) + ", expected " +
                 dtype_name(dt));
}

// Present, with a floating-point storage type (which ones a backend computes
// on is the backend's own check).
inline void need_float(const char* op, const char* name, const Tensor& t) {
  present(op, name, t);
  if (!is_float(t.dtype))
    fail(op, std::string(name) + " " + t.shape_str() + " is " + dtype_name(t.dtype) +
                 ", expected F32, BF16 or F16");
}

// Separate documents: absent, or one I32 document start per query row of
// q [B, T, H, D] (attention's doc_start and q_doc_start).
inline void check_doc_start(const char* op, const char* name, const Tensor& doc_start, const Tensor& q) {
  if (doc_start.empty()) return;
  need(op, name, doc_start, DType::I32);
  if (doc_start.numel() != q.dim(0) * q.dim(1))
    fail(op, std::string(name) + " " + doc_start.shape_str() + " vs q " + q.shape_str() + ": expected [" +
                 std::to_string(q.dim(0)) + ", " + std::to_string(q.dim(1)) + "], one document start per query row");
}

inline void need_ndim(const char* op, const char* name, const Tensor& t, int ndim) {
  if (t.ndim != ndim)
    fail(op, std::string(name) + " " + t.shape_str() + " must have " + std::to_string(ndim) + " dims");
}

// Equal rank and equal extents in every dimension in use.
inline bool same_dims(const Tensor& a, const Tensor& b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; ++i)
    if (a.shape[i] != b.shape[i]) return false;
  return true;
}

// The pairwise checks below compare shapes only; dtypes are need()'s job.

inline void same_numel(const char* op, const char* an, const Tensor& a, const char* bn,
                       const Tensor& b) {
  if (a.numel() != b.numel()) mismatch(op, an, a, " vs ", bn, b);
}

// The same rows of the same width, whatever the leading dims: equal numel and
// last dim.
inline void same_rows(const char* op, const char* an, const Tensor& a, const char* bn,
                      const Tensor& b) {
  if (a.numel() != b.numel() || a.ndim < 1 || b.ndim < 1 || a.dim(-1) != b.dim(-1))
    mismatch(op, an, a, " vs ", bn, b);
}

inline void same_shape(const char* op, const char* an, const Tensor& a, const char* bn,
                       const Tensor& b) {
  if (!same_dims(a, b)) mismatch(op, an, a, " vs ", bn, b);
}

// same_shape in the MoE ops' wording ("... must match ...").
inline void must_match(const char* op, const char* an, const Tensor& a, const char* bn,
                       const Tensor& b) {
  if (!same_dims(a, b)) mismatch(op, an, a, " must match ", bn, b);
}

// A float tensor laid out like another (an output or gradient like its input).
inline void float_rows_like(const char* op, const char* an, const Tensor& a, const char* bn,
                            const Tensor& b) {
  need_float(op, an, a);
  same_rows(op, an, a, bn, b);
}

inline void float_shape_like(const char* op, const char* an, const Tensor& a, const char* bn,
                             const Tensor& b) {
  need_float(op, an, a);
  same_shape(op, an, a, bn, b);
}

inline bool overlap(const Tensor& a, const Tensor& b) {
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// No two of the tensors share a byte: for ops that read one element of an
// input after writing another (a partial overlap would feed outputs back in).
inline void disjoint(const char* op,
                     std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  for (auto i = ts.begin(); i != ts.end(); ++i)
    for (auto j = i + 1; j != ts.end(); ++j)
      if (overlap(*i->second, *j->second))
        fail(op, std::string(i->first) + " " + i->second->shape_str() + " overlaps " + j->first +
                     " " + j->second->shape_str());
}

}  // namespace trainer::checks
