#include "model/tensor_parallel.h"

#include <stdexcept>
#include <string>

namespace trainer {

namespace {

// Rows [first, first + count) of a tensor viewed as [rows, numel / rows].
Tensor row_block(Tensor t, int64_t rows, int64_t first, int64_t count) {
  const int64_t width = rows > 0 ? t.numel() / rows : 0;
  return t.view({rows, width}).slice0(first, first + count);
}

void need_full(const ModelDims& d, const Tensor& t, const char* where) {
  if (t.numel() != d.N() * d.C)
    throw std::logic_error(std::string(where) + ": sequence parallelism needs the [N, C] scratch");
}

}  // namespace

Tensor own_rows(const ModelDims& d, const TensorParallel& tp, Tensor full) {
  if (!d.sp) return full;
  const int64_t n = d.rows();
  return row_block(full, d.N(), int64_t(tp.rank()) * n, n);
}

Tensor column_input(const ModelDims& d, const TensorParallel& tp, Tensor mine) {
  if (!d.sp) return mine;
  need_full(d, tp.gathered, "column_input");
  tp.comm().all_gather(tp.gathered, mine);
  return tp.gathered;
}

Tensor column_input_shape(const ModelDims& d, const TensorParallel& tp, Tensor mine) {
  if (!d.sp) return mine;
  need_full(d, tp.gathered, "column_input_shape");
  return tp.gathered;
}

Tensor column_input_grad(const ModelDims& d, const TensorParallel& tp, Tensor dfull) {
  if (tp.size() == 1) return dfull;
  if (!d.sp) {
    tp.comm().all_reduce(dfull);
    return dfull;
  }
  const Tensor mine = own_rows(d, tp, dfull);
  tp.comm().reduce_scatter(mine, dfull);
  return mine;
}

Tensor row_partial(const ModelDims& d, const TensorParallel& tp, Tensor out) {
  if (!d.sp) return out;
  need_full(d, tp.full, "row_partial");
  return tp.full;
}

void row_output(const ModelDims& d, const TensorParallel& tp, Tensor out, Tensor partial) {
  if (tp.size() == 1) return;
  if (d.sp)
    tp.comm().reduce_scatter(out, partial);
  else
    tp.comm().all_reduce(out);
}

Tensor row_output_grad(const ModelDims& d, const TensorParallel& tp, Tensor dout) {
  if (!d.sp) return dout;
  need_full(d, tp.full, "row_output_grad");
  tp.comm().all_gather(tp.full, dout);
  return tp.full;
}

void sum_over_tp(const TensorParallel& tp, Tensor t) {
  if (tp.size() > 1) tp.comm().all_reduce(t);
}

}  // namespace trainer
