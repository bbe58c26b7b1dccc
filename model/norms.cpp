#include "kernels/ops.h"
#include "model/layers.h"

namespace trainer {

void norm_forward(const ModelDims& d, Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w,
                  Tensor b) {
  if (d.llama)
    ops::rmsnorm_forward(out, rstd, x, w, d.eps);
  else
    ops::layernorm_forward(out, mean, rstd, x, w, b, d.eps);
}

void norm_backward(const ModelDims& d, Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x,
                   Tensor w, Tensor mean, Tensor rstd) {
  if (d.llama)
    ops::rmsnorm_backward(dx, dw, dout, x, w, rstd);
  else
    ops::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd);
}

}  // namespace trainer
