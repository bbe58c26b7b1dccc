// Shared checks of the linear layer (kernels/op_list.h).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// inp [..., IC], outlike [..., OC] over the same rows, weight [OC, IC]. Rows
// come from inp, so IC == 0 means no rows. Returns OC.
int64_t check_dims(const char* op, const Tensor& outlike, const char* out_name, const Tensor& inp,
                   const Tensor& weight) {
  need_float(op, "inp", inp);
  need_float(op, "weight", weight);
  need_float(op, out_name, outlike);
  if (weight.ndim != 2) fail(op, "weight " + weight.shape_str() + " must be [OC, IC]");
  const int64_t OC = weight.dim(0), IC = weight.dim(1);
  if (inp.ndim < 1 || inp.dim(-1) != IC)
    fail(op, "inp " + inp.shape_str() + " vs weight " + weight.shape_str());
  const int64_t N = IC > 0 ? inp.numel() / IC : 0;
  if (outlike.ndim < 1 || outlike.dim(-1) != OC || outlike.numel() != N * OC)
    fail(op, std::string(out_name) + " " + outlike.shape_str() + " vs inp " + inp.shape_str() +
                 " and weight " + weight.shape_str());
  return OC;
}

void check_vec(const char* op, const char* name, const Tensor& t, int64_t n) {
  need_float(op, name, t);
  if (t.numel() != n)
    fail(op, std::string(name) + " " + t.shape_str() + " must have " + std::to_string(n) + " elements");
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const char* op = "linear_forward";
  const int64_t OC = check_dims(op, out, "out", inp, weight);
  if (!bias.empty()) check_vec(op, "bias", bias, OC);
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                     Tensor weight, bool) {
  const char* op = "linear_backward";
  const int64_t OC = check_dims(op, dout, "dout", inp, weight);
  if (!dweight.empty()) float_rows_like(op, "dweight", dweight, "weight", weight);
  if (!dinp.empty()) float_rows_like(op, "dinp", dinp, "inp", inp);
  if (!dbias.empty()) check_vec(op, "dbias", dbias, OC);
}

}  // namespace trainer::op_checks
