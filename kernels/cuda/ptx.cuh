// Every PTX instruction the kernels issue by hand, one small device function
// each, so that a second implementation of these functions is all it takes to
// run the same kernel sources on the emulated device (TRAINER_CUDA_EMU, a
// host compiler's build): nothing outside this header writes inline asm.
//
// Under nvcc the bodies are exactly the ones attention.cu had: the PTX that
// comes out must not change (scripts/ptx_compare.sh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#ifndef TRAINER_CUDA_EMU

namespace trainer::cuda {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronous; valid == false writes 16 zero bytes
// (src-size 0: nothing is read). Ragged tails become zero rows this way.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"(static_cast<uint64_t>(__cvta_generic_to_global(src))), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// r[i] is this lane's fragment of matrix i: row lane/4, columns 2*(lane%4)+{0,1}
// (with .trans: rows 2*(lane%4)+{0,1}, column lane/4).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

// D (16x8 f32) += A (16x16) * B (16x8). With g = lane/4, t = lane%4:
//   A regs {a0,a1,a2,a3} = A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]
//   B regs {b0,b1}       = B[2t..2t+1][g], B[2t+8..2t+9][g]
//   C/D c0..c3           = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// (the lower-index element of a pair sits in the low 16 bits).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x (MUFU.EX2; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace trainer::cuda

#else  // TRAINER_CUDA_EMU

// The same functions on the emulated device (emu/ptx_lane.h): each lane's
// call reaches the PTX ISA's semantics, cp.async through the thread's own
// queue, ldmatrix and mma.sync through a collective of the whole warp.
#include "emu/ex2.h"
#include "emu/ptx_lane.h"

namespace trainer::cuda {

inline void cp_async_16(void* dst, const void* src, bool valid) {
  ::trainer::emu::thread_cp_async_queue().copy(::trainer::emu::CpAsyncCache::cg, dst, src, 16, valid ? 16 : 0);
}
inline void cp_async_commit() { ::trainer::emu::thread_cp_async_queue().commit(); }
template <int N> inline void cp_async_wait() { ::trainer::emu::thread_cp_async_queue().wait_group(N); }

inline void ldsm_x4(uint32_t (&r)[4], const void* p) { ::trainer::emu::ldmatrix_x4_lane(r, p, false); }
inline void ldsm_x4_trans(uint32_t (&r)[4], const void* p) { ::trainer::emu::ldmatrix_x4_lane(r, p, true); }

template <typename T>
void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
inline void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::trainer::emu::mma_m16n8k16_lane(::trainer::emu::Type16::bf16, c, a, b0, b1);
}
template <>
inline void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::trainer::emu::mma_m16n8k16_lane(::trainer::emu::Type16::f16, c, a, b0, b1);
}

inline float fast_exp2(float x) { return ::trainer::emu::ex2_approx_ftz_f32(x); }

}  // namespace trainer::cuda

#endif
