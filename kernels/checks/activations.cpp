// Shared checks of GELU and SwiGLU (kernels/op_list.h): every tensor holds
// the same rows as the input.
#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

using checks::float_rows_like;
using checks::need_float;

void gelu_forward(Tensor out, Tensor inp) {
  need_float("gelu_forward", "inp", inp);
  float_rows_like("gelu_forward", "out", out, "inp", inp);
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  need_float("gelu_backward", "inp", inp);
  float_rows_like("gelu_backward", "dinp", dinp, "inp", inp);
  float_rows_like("gelu_backward", "dout", dout, "inp", inp);
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  need_float("swiglu_forward", "gate", gate);
  float_rows_like("swiglu_forward", "out", out, "gate", gate);
  float_rows_like("swiglu_forward", "up", up, "gate", gate);
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  const char* op = "swiglu_backward";
  need_float(op, "gate", gate);
  float_rows_like(op, "dgate", dgate, "gate", gate);
  float_rows_like(op, "dup", dup, "gate", gate);
  float_rows_like(op, "dout", dout, "gate", gate);
  float_rows_like(op, "up", up, "gate", gate);
}

}  // namespace trainer::op_checks
