// Shared checks of the grouped (per-expert) linear (kernels/op_list.h). The
// offsets' values may come from another rank's counts (EP); each backend
// validates them where it can read them (the CPU on the host, CUDA after a
// copy), before any row is touched.
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// inp [rows, IC], weight [E, OC, IC], offsets [E+1] I32.
void check_groups(const char* op, const Tensor& inp, const Tensor& weight, const Tensor& offsets) {
  need_float(op, "inp", inp);
  need_ndim(op, "inp", inp, 2);
  need_float(op, "weight", weight);
  need_ndim(op, "weight", weight, 3);
  need(op, "offsets", offsets, DType::I32);
  need_ndim(op, "offsets", offsets, 1);
  const int64_t E = weight.dim(0);
  if (offsets.dim(0) != E + 1)
    fail(op, "offsets " + offsets.shape_str() + " must be [E+1] = [" + std::to_string(E + 1) +
                 "] for weight " + weight.shape_str());
  if (inp.dim(1) != weight.dim(2))
    fail(op, "inp " + inp.shape_str() + " must have IC = " + std::to_string(weight.dim(2)) +
                 " columns for weight " + weight.shape_str());
}

void check_rows(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols,
                const Tensor& weight) {
  need_float(op, name, t);
  need_ndim(op, name, t, 2);
  if (t.dim(0) != rows || t.dim(1) != cols)
    fail(op, std::string(name) + " " + t.shape_str() + " must be [" + std::to_string(rows) + ", " +
                 std::to_string(cols) + "] for weight " + weight.shape_str());
}

}  // namespace

void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets) {
  const char* op = "grouped_linear_forward";
  check_groups(op, inp, weight, offsets);
  check_rows(op, "out", out, inp.dim(0), weight.dim(1), weight);
}

// Either output may be absent: the first layer of a frozen stack needs no
// dinp, and a frozen expert needs no dweight.
void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                             Tensor offsets) {
  const char* op = "grouped_linear_backward";
  check_groups(op, inp, weight, offsets);
  check_rows(op, "dout", dout, inp.dim(0), weight.dim(1), weight);
  if (!dinp.empty()) check_rows(op, "dinp", dinp, inp.dim(0), weight.dim(2), weight);
  if (!dweight.empty()) {
    need_float(op, "dweight", dweight);
    need_ndim(op, "dweight", dweight, 3);
    must_match(op, "dweight", dweight, "weight", weight);
  }
}

}  // namespace trainer::op_checks
