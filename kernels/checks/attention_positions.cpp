// Shared checks of attention at explicit positions and of the merge of
// partial attentions (kernels/op_list.h, ring attention).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) about the
// inlined operator+ chain "[" + std::to_string(...).
std::string dims3(int64_t a, int64_t b, int64_t c) {
  std::string s = "[";
  s.append(std::to_string(a)).append(", ").append(std::to_string(b)).append(", ");
  s.append(std::to_string(c)).append("]");
  return s;
}

// lse [B, H, T] F32 (any shape with that many elements, as attention's).
void check_lse(const char* op, const char* name, const Tensor& lse, const char* like_name,
               const Tensor& like) {
  need(op, name, lse, DType::F32);
  const int64_t B = like.dim(0), T = like.dim(1), H = like.dim(2);
  if (lse.numel() != B * H * T)
    fail(op, std::string(name) + " " + lse.shape_str() + " vs " + like_name + " " +
                 like.shape_str() + ": expected " + dims3(B, H, T));
}

// One I32 position per token: [n].
void check_pos(const char* op, const char* name, const Tensor& pos, const char* of_name,
               const Tensor& of) {
  need(op, name, pos, DType::I32);
  if (pos.ndim != 1 || pos.dim(0) != of.dim(1))
    fail(op, std::string(name) + " " + pos.shape_str() + " vs " + of_name + " " + of.shape_str() +
                 ": expected [" + std::to_string(of.dim(1)) + "], one position per token");
}

// q [B, Tq, Hq, D], k and v [B, Tk, Hkv, D]: Tq and Tk may differ.
void check_qkv_pos(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& lse, const Tensor& q_pos, const Tensor& k_pos, int64_t window) {
  if (window < 0) fail(op, "window " + std::to_string(window) + " must be >= 0 (0: no window)");
  need_float(op, "q", q);
  need_float(op, "k", k);
  need_float(op, "v", v);
  if (q.ndim != 4) fail(op, "q " + q.shape_str() + " must be [B, Tq, Hq, D]");
  if (k.ndim != 4) fail(op, "k " + k.shape_str() + " must be [B, Tk, Hkv, D]");
  const int64_t B = q.dim(0), Hq = q.dim(2), Hkv = k.dim(2), D = q.dim(3);
  if (k.dim(0) != B || k.dim(3) != D) fail(op, "q " + q.shape_str() + " vs k " + k.shape_str());
  if (!same_dims(v, k)) fail(op, "k " + k.shape_str() + " vs v " + v.shape_str());
  if (Hkv <= 0 || Hq % Hkv != 0)
    fail(op, "q " + q.shape_str() + " vs k " + k.shape_str() + ": Hq must be a multiple of Hkv");
  check_lse(op, "lse", lse, "q", q);
  check_pos(op, "q_pos", q_pos, "q", q);
  check_pos(op, "k_pos", k_pos, "k", k);
}

}  // namespace

void attention_forward_pos(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor q_pos,
                           Tensor k_pos, int64_t window, Tensor q_doc_start) {
  const char* op = "attention_forward_pos";
  check_qkv_pos(op, q, k, v, lse, q_pos, k_pos, window);
  check_doc_start(op, "q_doc_start", q_doc_start, q);
  float_shape_like(op, "out", out, "q", q);
}

void attention_merge(Tensor out, Tensor lse, Tensor part_out, Tensor part_lse) {
  const char* op = "attention_merge";
  need_float(op, "out", out);
  if (out.ndim != 4) fail(op, "out " + out.shape_str() + " must be [B, T, H, D]");
  float_shape_like(op, "part_out", part_out, "out", out);
  check_lse(op, "lse", lse, "out", out);
  check_lse(op, "part_lse", part_lse, "out", out);
}

void attention_backward_pos(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                            Tensor v, Tensor out, Tensor lse, Tensor q_pos, Tensor k_pos,
                            int64_t window, Tensor q_doc_start) {
  const char* op = "attention_backward_pos";
  check_qkv_pos(op, q, k, v, lse, q_pos, k_pos, window);
  check_doc_start(op, "q_doc_start", q_doc_start, q);
  float_shape_like(op, "out", out, "q", q);
  float_shape_like(op, "dout", dout, "q", q);
  float_shape_like(op, "dq", dq, "q", q);
  float_shape_like(op, "dk", dk, "k", k);
  float_shape_like(op, "dv", dv, "v", v);
}

}  // namespace trainer::op_checks
