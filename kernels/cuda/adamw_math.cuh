// The per-element AdamW arithmetic of the CUDA backend, shared by adamw.cu
// (single tensor) and adamw_multi.cu (a list of tensors), so the two paths
// cannot drift apart: the multi-tensor update is bit for bit the
// single-tensor one.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/dtype.cuh"
#include "kernels/ops.h"

namespace trainer::cuda::adamw_detail {

// The step constants, formed on the host exactly as kernels/cpu/adamw.cpp
// forms them (double, rounded to fp32 where they meet a tensor).
struct Consts {
  float lr;             // for the decay factor, formed per tensor
  float w1;             // 1 - beta1: lerp weight of m toward g
  float one_minus_w1;   // 1.f - w1 (fp32, as the CPU)
  float beta2;
  float w2;             // 1 - beta2
  float neg_step_size;  // -lr / bc1
  float bc2_sqrt;       // sqrt(bc2)
  float eps;
  float grad_scale;
};

inline Consts make_consts(const ops::AdamWStep& s) {
  Consts c;
  c.lr = s.lr;
  c.w1 = float(1.0 - double(s.beta1));
  c.one_minus_w1 = 1.f - c.w1;
  c.beta2 = s.beta2;
  c.w2 = float(1.0 - double(s.beta2));
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  c.neg_step_size = float(-(double(s.lr) / bc1));
  c.bc2_sqrt = float(std::sqrt(bc2));
  c.eps = s.eps;
  c.grad_scale = s.grad_scale;
  return c;
}

// 1 - lr*wd in double, rounded once: the host's float(1.0 - double(lr)*double(wd)).
// Explicit _rn so nvcc cannot contract it into an fma (the host does not).
__device__ __forceinline__ float decay_factor(float lr, double wd) {
  return __double2float_rn(__dsub_rn(1.0, __dmul_rn(double(lr), wd)));
}

// One element, in kernels/cpu/adamw.cpp's order. Every operation is an
// explicit round-to-nearest intrinsic: no fma contraction, IEEE division and
// sqrt, so an F32 update matches the CPU backend bit for bit.
__device__ __forceinline__ void update(float& p, float& m, float& v, float g, float decay, const Consts& c) {
  const float gi = __fmul_rn(g, c.grad_scale);
  const float pi = __fmul_rn(p, decay);
  const float mi = c.w1 < 0.5f ? __fadd_rn(m, __fmul_rn(c.w1, __fsub_rn(gi, m)))
                               : __fsub_rn(gi, __fmul_rn(__fsub_rn(gi, m), c.one_minus_w1));
  const float vi = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.w2, gi), gi));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
  p = __fadd_rn(pi, __fdiv_rn(__fmul_rn(c.neg_step_size, mi), denom));
  m = mi;
  v = vi;
}

// Four consecutive elements of T, aligned to their size (16 B for F32, 8 B
// for BF16/F16): one vector load or store.
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// Elements per vector step.
constexpr int kVec = 4;

// The element phase of a pointer: (address / sizeof(T)) mod 4. Elements i
// with (phase + i) % 4 == 0 start an aligned Pack4. -1: not even aligned to
// sizeof(T) (never vectorise). Arrays with equal phases p vectorise together,
// with update_range's head = (4 - p) % 4.
template <typename T>
inline int phase_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a % sizeof(T) != 0) return -1;
  return int((a / sizeof(T)) % kVec);
}

// update_range's head for arrays of the given phases: -1 unless all are equal.
inline int common_head(std::initializer_list<int> phases) {
  const int p = *phases.begin();
  for (int q : phases)
    if (q < 0 || q != p) return -1;
  return (kVec - p) % kVec;
}

// Updates elements [begin, end) of one tensor. Thread `tid` of `nthreads`
// takes every nthreads-th vector of 4 (when `head` >= 0: the elements i with
// i % 4 == head start aligned Pack4s in every array) and every nthreads-th
// leftover element (before the first aligned index and after the last whole
// vector). head < 0: scalar only. kWriteParam = false: master is the
// parameter itself (adamw_update), param is not touched.
template <typename Tp, typename Tg, bool kWriteParam>
__device__ __forceinline__ void update_range(Tp* param, float* master, const Tg* grad, float* m, float* v,
                                             int64_t begin, int64_t end, int head, float decay,
                                             const Consts& c, int64_t tid, int64_t nthreads) {
  // Vector region [a, b): a = the first index >= begin with a % 4 == head.
  int64_t a = begin, b = begin;
  if (head >= 0) {
    a = begin + ((int64_t(head) - begin) % kVec + kVec) % kVec;
    if (a > end) a = end;
    b = a + (end - a) / kVec * kVec;
  }
  const int64_t nvec = (b - a) / kVec;
  for (int64_t k = tid; k < nvec; k += nthreads) {
    const int64_t i = a + k * kVec;
    Pack4<float> pm = *reinterpret_cast<const Pack4<float>*>(master + i);
    Pack4<float> mm = *reinterpret_cast<const Pack4<float>*>(m + i);
    Pack4<float> vv = *reinterpret_cast<const Pack4<float>*>(v + i);
    const Pack4<Tg> gg = *reinterpret_cast<const Pack4<Tg>*>(grad + i);
#pragma unroll
    for (int e = 0; e < kVec; ++e) update(pm.v[e], mm.v[e], vv.v[e], to_float(gg.v[e]), decay, c);
    *reinterpret_cast<Pack4<float>*>(master + i) = pm;
    *reinterpret_cast<Pack4<float>*>(m + i) = mm;
    *reinterpret_cast<Pack4<float>*>(v + i) = vv;
    if constexpr (kWriteParam) {
      Pack4<Tp> pp;
#pragma unroll
      for (int e = 0; e < kVec; ++e) pp.v[e] = from_float<Tp>(pm.v[e]);
      *reinterpret_cast<Pack4<Tp>*>(param + i) = pp;
    }
  }
  const int64_t nhead = a - begin;
  const int64_t nscalar = nhead + (end - b);
  for (int64_t k = tid; k < nscalar; k += nthreads) {
    const int64_t i = k < nhead ? begin + k : b + (k - nhead);
    float pm = master[i], mm = m[i], vv = v[i];
    update(pm, mm, vv, to_float(grad[i]), decay, c);
    master[i] = pm;
    m[i] = mm;
    v[i] = vv;
    if constexpr (kWriteParam) param[i] = from_float<Tp>(pm);
  }
}

}  // namespace trainer::cuda::adamw_detail

