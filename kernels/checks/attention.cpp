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

// A sliding window bounds how far back a query looks: it needs a causal mask
// (a window over future keys is no model of ours).
void check_window(const char* op, bool causal, int64_t window) {
  if (window < 0) fail(op, "window " + std::to_string(window) + " must be >= 0 (0: no window)");
  if (window > 0 && !causal) fail(op, "window " + std::to_string(window) + " needs causal = true");
}

// Documents separate a causal model's tokens; a full mask has no order to start them by.
void check_documents(const char* op, bool causal, const Tensor& doc_start, const Tensor& q) {
  check_doc_start(op, "doc_start", doc_start, q);
  if (!doc_start.empty() && !causal) fail(op, "doc_start (separate documents) needs causal = true");
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, int64_t window,
                       Tensor doc_start) {
  const char* op = "attention_forward";
  check_qkv(op, q, k, v, lse);
  check_window(op, causal, window);
  check_documents(op, causal, doc_start, q);
  float_shape_like(op, "out", out, "q", q);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                        Tensor out, Tensor lse, bool causal, int64_t window, Tensor doc_start) {
  const char* op = "attention_backward";
  check_qkv(op, q, k, v, lse);
  check_window(op, causal, window);
  check_documents(op, causal, doc_start, q);
  float_shape_like(op, "out", out, "q", q);
  float_shape_like(op, "dout", dout, "q", q);
  float_shape_like(op, "dq", dq, "q", q);
  float_shape_like(op, "dk", dk, "k", k);
  float_shape_like(op, "dv", dv, "v", v);
}

}  // namespace trainer::op_checks
