// Shared checks of RMSNorm and LayerNorm (kernels/op_list.h).
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// x is [..., C] with C > 0 taken from the 1-D weight; returns the number of rows.
int64_t rows_of(const char* op, const Tensor& x, const Tensor& weight) {
  need_float(op, "x", x);
  need_float(op, "weight", weight);
  if (weight.ndim != 1 || x.ndim < 1 || x.dim(-1) != weight.dim(0) || weight.dim(0) <= 0)
    fail(op, "x " + x.shape_str() + " vs weight " + weight.shape_str());
  return x.numel() / weight.dim(0);
}

// Row statistics: F32, one value per row.
void per_row(const char* op, const char* name, const Tensor& t, int64_t rows) {
  need(op, name, t, DType::F32);
  if (t.numel() != rows)
    fail(op, std::string(name) + " " + t.shape_str() + " must hold one value per row (" +
                 std::to_string(rows) + ")");
}

void same_as_weight(const char* op, const char* name, const Tensor& t, const Tensor& weight) {
  need_float(op, name, t);
  same_numel(op, name, t, "weight", weight);
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float) {
  const char* op = "rmsnorm_forward";
  const int64_t N = rows_of(op, x, weight);
  float_rows_like(op, "out", out, "x", x);
  per_row(op, "rstd", rstd, N);
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t N = rows_of(op, x, weight);
  float_rows_like(op, "dx", dx, "x", x);
  float_rows_like(op, "dout", dout, "x", x);
  same_as_weight(op, "dweight", dweight, weight);
  per_row(op, "rstd", rstd, N);
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias,
                       float) {
  const char* op = "layernorm_forward";
  const int64_t N = rows_of(op, x, weight);
  float_rows_like(op, "out", out, "x", x);
  per_row(op, "mean", mean, N);
  per_row(op, "rstd", rstd, N);
  if (!bias.empty()) same_as_weight(op, "bias", bias, weight);
}

void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                        Tensor weight, Tensor mean, Tensor rstd) {
  const char* op = "layernorm_backward";
  const int64_t N = rows_of(op, x, weight);
  float_rows_like(op, "dx", dx, "x", x);
  float_rows_like(op, "dout", dout, "x", x);
  same_as_weight(op, "dweight", dweight, weight);
  if (!dbias.empty()) same_as_weight(op, "dbias", dbias, weight);
  per_row(op, "mean", mean, N);
  per_row(op, "rstd", rstd, N);
}

}  // namespace trainer::op_checks
