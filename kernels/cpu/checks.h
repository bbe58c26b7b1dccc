// Argument checks shared by the CPU ops: every op validates its tensors before
// touching memory and throws std::invalid_argument("<op>: <what>"), naming the
// op, the tensors and their shapes, so a bad call says which one was wrong.
#pragma once

#include <stdexcept>
#include <string>

#include "core/tensor.h"

namespace trainer::cpu::checks {

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// "<an> [shape] <rel> <bn> [shape]", the message of every pairwise check.
[[noreturn]] inline void mismatch(const char* op, const char* an, const Tensor& a, const char* rel,
                                  const char* bn, const Tensor& b) {
  fail(op, std::string(an) + " " + a.shape_str() + rel + bn + " " + b.shape_str());
}

// Dense ops: t has data and dtype dt.
inline void need(const char* op, const char* name, const Tensor& t, DType dt) {
  if (t.empty()) fail(op, std::string(name) + " is empty");
  if (t.dtype != dt)
    fail(op, std::string(name) + " " + t.shape_str() + " is " + dtype_name(t.dtype) +
                 ", expected " + dtype_name(dt));
}

inline void need_f32(const char* op, const char* name, const Tensor& t) {
  need(op, name, t, DType::F32);
}

// MoE ops: t is on the host with dtype dt and exactly ndim dims. Unlike
// need(), a tensor with no elements may have no data (an expert or a rank can
// get zero rows).
inline void need_cpu(const char* op, const char* name, const Tensor& t, DType dt, int ndim) {
  if (t.data == nullptr && t.numel() > 0) fail(op, std::string(name) + " is missing");
  if (t.device != Device::CPU)
    fail(op, std::string(name) + " " + t.shape_str() + " is not on the CPU");
  if (t.dtype != dt)
    fail(op, std::string(name) + " " + t.shape_str() + " has dtype " + dtype_name(t.dtype) +
                 ", expected " + dtype_name(dt));
  if (t.ndim != ndim)
    fail(op,
         std::string(name) + " " + t.shape_str() + " must have " + std::to_string(ndim) + " dims");
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
  if (a.numel() != b.numel() || a.dim(-1) != b.dim(-1)) mismatch(op, an, a, " vs ", bn, b);
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

// An F32 tensor laid out like another (an output or gradient like its input).
inline void same_rows_f32(const char* op, const char* an, const Tensor& a, const char* bn,
                          const Tensor& b) {
  need_f32(op, an, a);
  need_f32(op, bn, b);
  same_rows(op, an, a, bn, b);
}

inline void same_shape_f32(const char* op, const char* an, const Tensor& a, const char* bn,
                           const Tensor& b) {
  need_f32(op, an, a);
  need_f32(op, bn, b);
  same_shape(op, an, a, bn, b);
}

}  // namespace trainer::cpu::checks
