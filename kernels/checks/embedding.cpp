// Shared checks of the embedding ops (kernels/op_list.h). Whether every id
// lies in the vocabulary is the backends' business: the CPU reads the ids,
// CUDA cannot without a sync and marks bad rows instead.
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// ids may be [N] or [B,T]; rows of `rows_t` ([..., C]) match them one to one.
void check(const char* op, const Tensor& rows_t, const char* rows_name, const Tensor& ids,
           const Tensor& table, const char* table_name, int64_t row_offset, int64_t vocab_size) {
  need(op, "ids", ids, DType::I32);
  need_float(op, table_name, table);
  need_float(op, rows_name, rows_t);
  if (table.ndim != 2)
    fail(op, std::string(table_name) + " " + table.shape_str() + " must be [V, C]");
  const int64_t C = table.dim(1);
  if (rows_t.ndim < 1 || rows_t.dim(-1) != C || rows_t.numel() != ids.numel() * C)
    fail(op, std::string(rows_name) + " " + rows_t.shape_str() + " vs ids " + ids.shape_str() +
                 " and " + table_name + " " + table.shape_str());
  // A row_offset past the vocabulary is allowed: with a vocabulary padded to
  // a multiple of the tensor-parallel size, the last ranks may hold padding
  // rows only.
  if (row_offset < 0) fail(op, "row_offset " + std::to_string(row_offset) + " must be >= 0");
  if (vocab_size < 1) fail(op, "vocab_size " + std::to_string(vocab_size) + " must be >= 1");
}

}  // namespace

void embedding_forward(Tensor out, Tensor ids, Tensor table, bool, int64_t row_offset,
                       int64_t vocab_size) {
  check("embedding_forward", out, "out", ids, table, "table", row_offset, vocab_size);
}

void embedding_backward(Tensor dtable, Tensor ids, Tensor dout, int64_t row_offset,
                        int64_t vocab_size) {
  check("embedding_backward", dout, "dout", ids, dtable, "dtable", row_offset, vocab_size);
}

}  // namespace trainer::op_checks
