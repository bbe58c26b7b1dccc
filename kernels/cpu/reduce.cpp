// Reductions of the CPU backend (kernels/op_list.h): sum and sum_squares, in
// double (sum_squares in row_math's lanes: one running sum is a chain of
// dependent adds, and it is the gradient norm's pass over every gradient).
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/checksum_math.h"

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"
#include "kernels/cpu/row_math.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

double sum_squares(Tensor x) {
  need_f32("sum_squares", {{"x", &x}});
  const float* p = x.f32();
  const int64_t n = x.numel();
  // Fixed-size chunks summed in chunk order: the gradient norm (and so the
  // clipping factor) is bitwise the same whatever the thread count, which an
  // OpenMP reduction does not promise.
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const float* x = p + c * kChunk;
    partial[size_t(c)] = lane_sum(std::min(kChunk, n - c * kChunk), [x](int64_t i) { return double(x[i]) * x[i]; });
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

// Summed in double so that a loss over many tokens does not depend on the
// order fp32 partial sums would take.
double sum(Tensor x) {
  need_f32("sum", {{"x", &x}});
  const float* p = x.f32();
  const int64_t n = x.numel();
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

// An integer sum: OpenMP's reduction order cannot change it.
uint64_t checksum(Tensor x) {
  const auto* p = static_cast<const unsigned char*>(x.data);
  const int64_t bytes = int64_t(x.nbytes()), whole = bytes / 4;
  uint64_t s = 0;
  // Whole words with a fixed-size load each (one instruction); the last,
  // partial word below. Little-endian, as the CUDA backend assembles it.
#pragma omp parallel for reduction(+ : s) schedule(static) if (whole > (1 << 16))
  for (int64_t i = 0; i < whole; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    s += checksum_math::term(w, uint64_t(i));
  }
  if (bytes % 4) {
    uint32_t w = 0;
    std::memcpy(&w, p + 4 * whole, size_t(bytes % 4));
    s += checksum_math::term(w, uint64_t(whole));
  }
  return checksum_math::finish(s, uint64_t(bytes));
}

}  // namespace trainer::cpu
