// Shared checks of the cross-entropy ops (kernels/op_list.h): the fused one
// and the vocabulary-parallel pair. Whether every target lies in the
// vocabulary is the backends' business (the CPU reads them; CUDA cannot
// without a sync).
#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

using namespace checks;

namespace {

// In place is allowed only as the very same tensor; any other overlap would
// let one row's gradient overwrite another row's logits.
void dlogits_alias(const char* op, const Tensor& dlogits, const Tensor& logits) {
  if (overlap(dlogits, logits) && (dlogits.data != logits.data || dlogits.dtype != logits.dtype))
    fail(op, "dlogits " + dlogits.shape_str() + " " + dtype_name(dlogits.dtype) +
                 " partially overlaps logits " + logits.shape_str() + " " +
                 dtype_name(logits.dtype) + " (in place needs the same data and dtype)");
}

// logits [..., Vl] with one row per target; returns N. Vl may be 0 (a rank
// whose columns are all past the vocabulary still takes part), so N comes
// from the targets.
int64_t vocab_part(const char* op, const Tensor& logits, const Tensor& targets,
                   int64_t vocab_offset, int64_t valid_cols) {
  need_float(op, "logits", logits);
  need(op, "targets", targets, DType::I32);
  if (logits.ndim < 1) fail(op, "logits " + logits.shape_str() + " must be [N, Vl]");
  const int64_t N = targets.numel(), Vl = logits.dim(-1);
  if (logits.numel() != N * Vl)
    fail(op, "logits " + logits.shape_str() + " vs targets " + targets.shape_str() +
                 ": expected one row of logits per target");
  if (vocab_offset < 0) fail(op, "vocab_offset " + std::to_string(vocab_offset) + " must be >= 0");
  if (valid_cols < 0 || valid_cols > Vl)
    fail(op, "valid_cols " + std::to_string(valid_cols) + " must lie in [0, " + std::to_string(Vl) +
                 "] (the columns of logits " + logits.shape_str() + ")");
  return N;
}

// An output shares no byte with the tensors listed (inputs overlapping each
// other is harmless: they are only read).
void apart(const char* op, const char* out_name, const Tensor& out,
           std::initializer_list<std::pair<const char*, const Tensor*>> others) {
  for (const auto& [name, t] : others)
    if (overlap(out, *t)) mismatch(op, out_name, out, " overlaps ", name, *t);
}

}  // namespace

void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                    float) {
  const char* op = "cross_entropy_forward_backward";
  need_float(op, "logits", logits);
  need(op, "targets", targets, DType::I32);
  need(op, "losses", losses, DType::F32);
  if (logits.ndim < 1) fail(op, "logits " + logits.shape_str() + " must be [N, V]");
  const int64_t V = logits.dim(-1);
  const int64_t N = V > 0 ? logits.numel() / V : 0;
  if (targets.numel() != N)
    fail(op, "targets " + targets.shape_str() + " vs logits " + logits.shape_str());
  if (losses.numel() != N)
    fail(op, "losses " + losses.shape_str() + " vs logits " + logits.shape_str());
  if (!dlogits.empty()) {
    float_rows_like(op, "dlogits", dlogits, "logits", logits);
    dlogits_alias(op, dlogits, logits);
    if (overlap(losses, dlogits))
      mismatch(op, "losses", losses, " overlaps ", "dlogits", dlogits);
  }
  if (overlap(losses, logits)) mismatch(op, "losses", losses, " overlaps ", "logits", logits);
}

void cross_entropy_partial_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                                 int64_t valid_cols, int64_t vocab_size) {
  const char* op = "cross_entropy_partial_stats";
  const int64_t N = vocab_part(op, logits, targets, vocab_offset, valid_cols);
  need(op, "stats", stats, DType::F32);
  if (stats.ndim != 2 || stats.dim(0) != N || stats.dim(1) != 3)
    fail(op, "stats " + stats.shape_str() + " vs targets " + targets.shape_str() + ": expected [" +
                 std::to_string(N) + ", 3]");
  if (vocab_size < 1) fail(op, "vocab_size " + std::to_string(vocab_size) + " must be >= 1");
  // A rank past the vocabulary (padding only, valid_cols = 0) may start
  // anywhere; real columns must be vocabulary ids.
  if (valid_cols > 0 && vocab_offset + valid_cols > vocab_size)
    fail(op, "vocab_offset " + std::to_string(vocab_offset) + " + valid_cols " +
                 std::to_string(valid_cols) + " is past the vocabulary [0, " +
                 std::to_string(vocab_size) + ")");
  apart(op, "stats", stats, {{"logits", &logits}, {"targets", &targets}});
}

void cross_entropy_vocab_parallel(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                  Tensor all_stats, int64_t vocab_offset, int64_t valid_cols,
                                  float) {
  const char* op = "cross_entropy_vocab_parallel";
  const int64_t N = vocab_part(op, logits, targets, vocab_offset, valid_cols);
  need(op, "losses", losses, DType::F32);
  need(op, "all_stats", all_stats, DType::F32);
  if (losses.numel() != N)
    fail(op, "losses " + losses.shape_str() + " vs targets " + targets.shape_str());
  if (all_stats.ndim != 3 || all_stats.dim(0) < 1 || all_stats.dim(1) != N || all_stats.dim(2) != 3)
    fail(op, "all_stats " + all_stats.shape_str() + " vs targets " + targets.shape_str() +
                 ": expected [P, " + std::to_string(N) + ", 3] with P >= 1 ranks");
  apart(op, "losses", losses, {{"logits", &logits}, {"targets", &targets}, {"all_stats", &all_stats}});
  if (!dlogits.empty()) {
    float_rows_like(op, "dlogits", dlogits, "logits", logits);
    dlogits_alias(op, dlogits, logits);
    apart(op, "dlogits", dlogits,
          {{"losses", &losses}, {"targets", &targets}, {"all_stats", &all_stats}});
  }
}

}  // namespace trainer::op_checks
