// Elementwise and memory ops of the CPU backend (kernels/op_list.h): fill,
// copy, add, add_inplace, scale_inplace, convert.
#include <cstring>
#include <string>

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

// Same dtype only: the CPU backend holds nothing but F32 (and moves bytes).
void convert(Tensor dst, Tensor src) {
  if (dst.dtype != src.dtype)
    checks::fail("convert", std::string("the CPU backend is fp32 only: ") + dtype_name(src.dtype) +
                                src.shape_str() + " -> " + dtype_name(dst.dtype) + dst.shape_str());
  if (dst.data != src.data && src.nbytes() > 0) std::memmove(dst.data, src.data, src.nbytes());
}

}  // namespace trainer::cpu
