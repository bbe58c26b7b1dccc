// Shared checks of the rotary position embedding (kernels/op_list.h).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

void need_bthd(const char* op, const char* name, const Tensor& t) {
  need_float(op, name, t);
  if (t.ndim != 4) fail(op, std::string(name) + " " + t.shape_str() + " must be [B, T, H, D]");
  if (t.dim(3) % 2 != 0)
    fail(op, std::string(name) + " " + t.shape_str() + ": head dim D must be even");
}

void check(const char* op, const char* out_name, const Tensor& out, const char* inp_name,
           const Tensor& inp, const Rope& rope, int64_t pos_offset) {
  need_bthd(op, out_name, out);
  need_bthd(op, inp_name, inp);
  same_shape(op, out_name, out, inp_name, inp);
  if (const std::string bad = ops::rope_problem(rope); !bad.empty()) fail(op, bad);
  if (pos_offset < 0) fail(op, "pos_offset " + std::to_string(pos_offset) + " must be >= 0");
}

// pos [T] I32 (T = x.dim(1), shared by the batch rows) or [B, T] (one per
// token); its values are any int32 (nothing to check without reading them,
// which a device tensor does not allow here).
void check_pos(const char* op, const char* out_name, const Tensor& out, const char* inp_name,
               const Tensor& inp, const Rope& rope, const Tensor& pos) {
  check(op, out_name, out, inp_name, inp, rope, 0);
  need(op, "pos", pos, DType::I32);
  const int64_t B = inp.dim(0), T = inp.dim(1);
  const bool shared = pos.ndim == 1 && pos.dim(0) == T;
  const bool per_token = pos.ndim == 2 && pos.dim(0) == B && pos.dim(1) == T;
  if (!shared && !per_token)
    fail(op, "pos " + pos.shape_str() + " vs " + inp_name + " " + inp.shape_str() + ": expected [" +
                 std::to_string(T) + "] (one position per token of a sequence) or [" + std::to_string(B) + ", " +
                 std::to_string(T) + "] (one per token)");
}

}  // namespace

void rope_forward(Tensor out, Tensor inp, const Rope& rope, int64_t pos_offset) {
  check("rope_forward", "out", out, "inp", inp, rope, pos_offset);
}

void rope_backward(Tensor dinp, Tensor dout, const Rope& rope, int64_t pos_offset) {
  check("rope_backward", "dinp", dinp, "dout", dout, rope, pos_offset);
}

void rope_forward_pos(Tensor out, Tensor inp, const Rope& rope, Tensor pos) {
  check_pos("rope_forward_pos", "out", out, "inp", inp, rope, pos);
}

void rope_backward_pos(Tensor dinp, Tensor dout, const Rope& rope, Tensor pos) {
  check_pos("rope_backward_pos", "dinp", dinp, "dout", dout, rope, pos);
}

}  // namespace trainer::op_checks
