// Elementwise and memory ops of the CPU backend (see kernels/ops.h).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

// Below this many elements a parallel region costs more than the loop.
constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

void fill(Tensor t, float value) {
  need_f32("fill", {{"t", &t}});
  float* p = t.f32();
  const int64_t n = t.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void copy(Tensor dst, Tensor src) {
  // memmove: a caller copying between overlapping views of one arena gets the
  // source as it was before the copy.
  if (dst.data != src.data && dst.nbytes() > 0) std::memmove(dst.data, src.data, dst.nbytes());
}

void add(Tensor out, Tensor a, Tensor b) {
  need_f32("add", {{"out", &out}, {"a", &a}, {"b", &b}});
  float* o = out.f32();
  const float* x = a.f32();
  const float* y = b.f32();
  const int64_t n = out.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

void add_inplace(Tensor acc, Tensor x) {
  need_f32("add_inplace", {{"acc", &acc}, {"x", &x}});
  float* o = acc.f32();
  const float* p = x.f32();
  const int64_t n = acc.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) o[i] += p[i];
}

void scale_inplace(Tensor t, float s) {
  need_f32("scale_inplace", {{"t", &t}});
  float* p = t.f32();
  const int64_t n = t.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) p[i] *= s;
}

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
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double s = 0;
    for (int64_t i = c * kChunk; i < end; ++i) s += double(p[i]) * double(p[i]);
    partial[size_t(c)] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace trainer::cpu
