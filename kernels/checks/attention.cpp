// Shared checks of attention (kernels/op_list.h).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse) {
  need_float(op, "q", q);
  need_float(op, "k", k);
  need_float(op, "v", v);
  need(op, "lse", lse, DType::F32);
  if (q.ndim != 4) fail(op, "q " + q.shape_str() + " must be [B, T, Hq, D]");
  if (k.ndim != 4) fail(op, "k " + k.shape_str() + " must be [B, T, Hkv, D]");
  const int64_t B = q.dim(0), T = q.dim(1), Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  if (k.dim(0) != B || k.dim(1) != T || k.dim(3) != D)
    fail(op, "q " + q.shape_str() + " vs k " + k.shape_str());
  if (!same_dims(v, k)) fail(op, "k " + k.shape_str() + " vs v " + v.shape_str());
  if (Hkv <= 0 || Hq % Hkv != 0)
    fail(op, "q " + q.shape_str() + " vs k " + k.shape_str() + ": Hq must be a multiple of Hkv");
  if (lse.numel() != B * Hq * T)
    fail(op, "lse " + lse.shape_str() + " vs q " + q.shape_str() + ": expected [" +
                 std::to_string(B) + ", " + std::to_string(Hq) + ", " + std::to_string(T) + "]");
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool) {
  const char* op = "attention_forward";
  check_qkv(op, q, k, v, lse);
  float_shape_like(op, "out", out, "q", q);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                        Tensor out, Tensor lse, bool) {
  const char* op = "attention_backward";
  check_qkv(op, q, k, v, lse);
  float_shape_like(op, "out", out, "q", q);
  float_shape_like(op, "dout", dout, "q", q);
  float_shape_like(op, "dq", dq, "q", q);
  float_shape_like(op, "dk", dk, "k", k);
  float_shape_like(op, "dv", dv, "v", v);
}

}  // namespace trainer::op_checks
