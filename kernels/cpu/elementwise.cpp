// Elementwise and memory ops of the CPU backend (kernels/op_list.h): fill,
// copy, add, add_inplace, scale_inplace, convert.
#include <cstring>
#include <string>

#include "core/half_float.h"
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

namespace {

float widen(DType t, const void* p, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == DType::BF16 ? f32_from_bf16(h) : f32_from_f16(h);
}

void narrow(DType t, void* p, int64_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = t == DType::BF16 ? bf16_from_f32(v) : f16_from_f32(v);
}

}  // namespace

// The CPU backend computes in F32 only, but a GPU run stages its BF16/F16
// tensors in host memory (ZeRO-Offload's gradients and weights, the
// host-staged backend's reductions, which Gloo runs in F32): those convert
// here, rounding to nearest even as the GPU's convert does.
void convert(Tensor dst, Tensor src) {
  if (dst.dtype == src.dtype) {
    if (dst.data != src.data && src.nbytes() > 0) std::memmove(dst.data, src.data, src.nbytes());
    return;
  }
  const int64_t n = dst.numel();
#pragma omp parallel for if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) narrow(dst.dtype, dst.data, i, widen(src.dtype, src.data, i));
}

}  // namespace trainer::cpu
