// Token (and position) embedding lookup of the CPU backend (see kernels/op_list.h).
#include <algorithm>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

// Shapes are checked by the router (kernels/checks/embedding.cpp). Every id is
// checked before any write so a bad batch leaves outputs untouched. The
// bound is the vocabulary, not the rows held here: with a vocabulary split
// over ranks an id of another rank is valid and simply contributes nothing.
void check(const char* op, const Tensor& rows_t, const char* rows_name, const Tensor& ids,
           const Tensor& table, const char* table_name, int64_t vocab_size) {
  need_f32(op, {{table_name, &table}, {rows_name, &rows_t}});
  const int32_t* id = ids.i32();
  for (int64_t n = 0; n < ids.numel(); ++n)
    if (id[n] < 0 || id[n] >= vocab_size)
      checks::fail(op, "id " + std::to_string(id[n]) + " at position " + std::to_string(n) +
                   " is outside the vocabulary [0, " + std::to_string(vocab_size) + ")");
}

}  // namespace

void embedding_forward(Tensor out, Tensor ids, Tensor table, bool accumulate, int64_t row_offset,
                       int64_t vocab_size) {
  check("embedding_forward", out, "out", ids, table, "table", vocab_size);
  const int64_t N = ids.numel(), rows = table.dim(0), C = table.dim(1);
  const int32_t* id = ids.i32();
  const float* tab = table.f32();
  float* o = out.f32();
#pragma omp parallel for if (N * C >= kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t r = int64_t(id[n]) - row_offset;
    float* dst = o + n * C;
    if (r < 0 || r >= rows) {
      // Another rank's id. Accumulating leaves dst untouched (adding +0 would
      // turn -0 into +0), so the sum over ranks is the whole lookup bit for bit.
      if (!accumulate) std::fill(dst, dst + C, 0.f);
      continue;
    }
    const float* src = tab + r * C;
    if (accumulate)
      for (int64_t c = 0; c < C; ++c) dst[c] += src[c];
    else
      std::copy(src, src + C, dst);
  }
}

void embedding_backward(Tensor dtable, Tensor ids, Tensor dout, int64_t row_offset,
                        int64_t vocab_size) {
  check("embedding_backward", dout, "dout", ids, dtable, "dtable", vocab_size);
  const int64_t N = ids.numel(), rows = dtable.dim(0), C = dtable.dim(1);
  const int32_t* id = ids.i32();
  const float* g = dout.f32();
  float* dt = dtable.f32();
  // Repeated ids would race if threads split the tokens, so threads split the
  // channels instead; each table entry then sums its tokens in token order,
  // which also keeps the result independent of the thread count.
  constexpr int64_t kCols = 64;
  const int64_t blocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin && blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kCols, c1 = std::min(C, c0 + kCols);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = int64_t(id[n]) - row_offset;
      if (r < 0 || r >= rows) continue;
      const float* src = g + n * C;
      float* dst = dt + r * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace trainer::cpu
