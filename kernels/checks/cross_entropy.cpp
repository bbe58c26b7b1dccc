// Shared checks of the fused cross-entropy (kernels/op_list.h). Whether every
// target lies in the vocabulary is the backends' business (the CPU reads
// them; CUDA cannot without a sync).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

using namespace checks;

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
    // In place is allowed only as the very same tensor; any other overlap
    // would let one row's gradient overwrite another row's logits.
    if (overlap(dlogits, logits) && (dlogits.data != logits.data || dlogits.dtype != logits.dtype))
      fail(op, "dlogits " + dlogits.shape_str() + " " + dtype_name(dlogits.dtype) +
                   " partially overlaps logits " + logits.shape_str() + " " +
                   dtype_name(logits.dtype) + " (in place needs the same data and dtype)");
    if (overlap(losses, dlogits))
      mismatch(op, "losses", losses, " overlaps ", "dlogits", dlogits);
  }
  if (overlap(losses, logits)) mismatch(op, "losses", losses, " overlaps ", "logits", logits);
}

}  // namespace trainer::op_checks
