// The CUDA device language's built-in variables, barriers, warp functions and
// bit intrinsics for kernels compiled by a host compiler (the emulated
// device; included by emu/cuda_shim/cuda_runtime.h after the toolkit's
// host headers, whose crt/host_defines.h already turns __global__,
// __device__, __host__, __shared__ into nothing and __forceinline__,
// __align__ into GCC attributes).
//
// threadIdx and friends are macros over the running CUDA thread's
// coordinates (emu::Dim3: unsigned x, y, z, as uint3 and dim3 hold), so
// `threadIdx.x` reads the calling fiber's own value; used outside a kernel
// they throw, naming the function.
#pragma once

#include "emu/shuffle.h"
#include "emu/simt.h"
#include "emu/warp.h"

// Occupancy hints for nvcc's register allocator; nothing to do on the host.
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#define threadIdx (::trainer::emu::thread_idx())
#define blockIdx (::trainer::emu::block_idx())
#define blockDim (::trainer::emu::block_dim())
#define gridDim (::trainer::emu::grid_dim())

inline constexpr int warpSize = 32;

inline void __syncthreads() { ::trainer::emu::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::trainer::emu::sync_warp(mask); }

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return ::trainer::emu::shfl_sync(mask, var, src_lane, width);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::trainer::emu::shfl_up_sync(mask, var, delta, width);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::trainer::emu::shfl_down_sync(mask, var, delta, width);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::trainer::emu::shfl_xor_sync(mask, var, lane_mask, width);
}

inline unsigned __ballot_sync(unsigned mask, int predicate) { return ::trainer::emu::ballot(mask, predicate != 0); }

// A load through the read-only data cache: a plain load here.
template <class T>
T __ldg(const T* p) {
  return *p;
}

// Bit intrinsics (CUDA Math API, "Integer Intrinsics"): defined for every
// input, 0 included, unlike the GCC builtins they use.
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline unsigned __brev(unsigned x) {
  x = (x >> 1 & 0x55555555u) | (x & 0x55555555u) << 1;
  x = (x >> 2 & 0x33333333u) | (x & 0x33333333u) << 2;
  x = (x >> 4 & 0x0f0f0f0fu) | (x & 0x0f0f0f0fu) << 4;
  return __builtin_bswap32(x);
}
