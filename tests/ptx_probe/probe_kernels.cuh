// The probe kernels: each issues one kind of instruction through the same
// seams the module's kernels use (kernels/cuda/ptx.cuh, launch.cuh,
// shared_memory.cuh) or the CUDA builtin itself, on inputs read from global
// memory, and writes the raw result bits back. Compiled by nvcc for a GPU and
// by the host compiler for the emulated device (TRAINER_CUDA_EMU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/shared_memory.cuh"
#include "tests/ptx_probe/probe.h"

namespace ptx_probe {

// One warp; per lane kMmaWords input words, 4 output words (d0..d3).
template <typename T>
__global__ void mma_kernel(const uint32_t* in, uint32_t* out) {
  const int lane = int(threadIdx.x);
  const uint32_t* w = in + lane * kMmaWords;
  const uint32_t a[4] = {w[0], w[1], w[2], w[3]};
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = __uint_as_float(w[6 + i]);
  trainer::cuda::mma_16816<T>(c, a, w[4], w[5]);
  for (int i = 0; i < 4; ++i) out[lane * 4 + i] = __float_as_uint(c[i]);
}

// One warp; kLdsmRows * 16 bytes of dynamic shared memory whose 16-bit
// element i holds i, so every output half names the element it came from.
__global__ void ldmatrix_kernel(const uint32_t* rows, uint32_t* out) {
  TRAINER_DYNAMIC_SHARED(unsigned char, ldsm_smem, 16);
  auto* elems = reinterpret_cast<uint16_t*>(ldsm_smem);
  const int lane = int(threadIdx.x);
  for (int e = lane; e < kLdsmRows * 8; e += kLanes) elems[e] = uint16_t(e);
  __syncthreads();
  for (int config = 0; config < kLdsmConfigs; ++config) {
    const void* row = ldsm_smem + rows[config * kLanes + lane] * 16;
    uint32_t r[4];
    if (config % 2) trainer::cuda::ldsm_x4_trans(r, row);
    else trainer::cuda::ldsm_x4(r, row);
    for (int i = 0; i < 4; ++i) out[(config * kLanes + lane) * 4 + i] = r[i];
  }
}

// One warp. Only what the ISA defines is read: after wait_group 1 a thread's
// own chunks of the first group (the second may or may not have landed), after
// wait_group 0 and a barrier everything.
__global__ void cp_async_kernel(const uint32_t* src, uint32_t* out_wait1, uint32_t* out_all) {
  TRAINER_DYNAMIC_SHARED(unsigned char, cp_smem, 16);
  auto* words = reinterpret_cast<uint32_t*>(cp_smem);
  const int t = int(threadIdx.x);
  for (int w = t; w < kCpChunks * 4; w += kLanes) words[w] = kCpPattern | uint32_t(w);
  __syncthreads();
  trainer::cuda::cp_async_16(cp_smem + (0 * kLanes + t) * 16, src + t * 4, true);
  trainer::cuda::cp_async_16(cp_smem + (1 * kLanes + t) * 16, src + (32 + t) * 4, cp_chunk1_valid(t));
  trainer::cuda::cp_async_commit();
  trainer::cuda::cp_async_16(cp_smem + (2 * kLanes + t) * 16, src + cp_chunk2_source(t) * 4, cp_chunk2_valid(t));
  trainer::cuda::cp_async_commit();
  trainer::cuda::cp_async_wait<1>();
  for (int k = 0; k < 2; ++k)
    for (int w = 0; w < 4; ++w) out_wait1[t * 8 + k * 4 + w] = words[(k * kLanes + t) * 4 + w];
  trainer::cuda::cp_async_wait<0>();
  __syncthreads();
  for (int w = t; w < kCpChunks * 4; w += kLanes) out_all[w] = words[w];
}

__global__ void ex2_kernel(const float* in, uint32_t* out, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = __float_as_uint(trainer::cuda::fast_exp2(in[i]));
}

template <typename T>
__device__ T shuffle(const ShflCase& k, T v, int lane) {
  const int b = k.b + lane * k.lane_step;
  switch (k.mode) {
    case kShflXor: return __shfl_xor_sync(k.mask, v, b, k.width);
    case kShflDown: return __shfl_down_sync(k.mask, v, unsigned(b), k.width);
    case kShflUp: return __shfl_up_sync(k.mask, v, unsigned(b), k.width);
    default: return __shfl_sync(k.mask, v, b, k.width);
  }
}

// One warp, every case in turn; lanes outside a case's mask skip it (and so
// diverge, as a partial mask requires) and leave their output words alone.
__global__ void shfl_kernel(const ShflCase* cases, int n, const uint32_t* vals, uint32_t* out) {
  const int lane = int(threadIdx.x);
  for (int c = 0; c < n; ++c) {
    const ShflCase k = cases[c];
    const uint32_t v = vals[c * kLanes + lane];
    uint32_t* o = out + (c * kLanes + lane) * 2;
    if (!(k.mask >> lane & 1u)) continue;
    if (k.mode == kBallot) {
      o[0] = __ballot_sync(k.mask, (v & uint32_t(k.b)) != 0);
    } else if (k.type == kF32) {
      o[0] = __float_as_uint(shuffle(k, __uint_as_float(v), lane));
    } else if (k.type == kU64) {
      const unsigned long long x = shuffle(k, (static_cast<unsigned long long>(v) << 32) | (v ^ kShflLowMix), lane);
      o[0] = uint32_t(x);
      o[1] = uint32_t(x >> 32);
    } else {
      o[0] = uint32_t(shuffle(k, int(v), lane));
    }
  }
}

// kBarrierThreads threads: two exchanges through shared memory, each needing
// the barrier before it (a missing one reads the poison or the old value).
__global__ void barrier_kernel(const uint32_t* in, uint32_t* out) {
  TRAINER_SHARED(uint32_t, bar_s, [kBarrierThreads]);
  const int t = int(threadIdx.x), n = kBarrierThreads;
  bar_s[t] = in[t];
  __syncthreads();
  const uint32_t x = bar_s[(t * 37 + 11) % n] ^ bar_s[n - 1 - t];
  __syncthreads();
  bar_s[t] = x * 2654435761u;
  __syncthreads();
  out[t] = bar_s[(t + 1) % n] + x;
}

__global__ void atomic_kernel(int* ints, float* floats) {
  const int blk = int(blockIdx.x), t = int(threadIdx.x);
  atomicAdd(&ints[t % kAtomicInts], atomic_int_term(blk, t));
  atomicAdd(&floats[t % kAtomicFloats], atomic_float_term(blk, t));
}

}  // namespace ptx_probe
