// Packs: a thread's run of P consecutive elements loaded to / stored from
// fp32 registers, as 16-byte vector accesses when P > 1 (memory-bound kernels
// reach full bandwidth only with wide accesses) or one element when P == 1.
// The host picks the vector path only when every pointer is 16-byte aligned.
#pragma once

#include <cstdint>

#include "kernels/cuda/dtype.cuh"

namespace trainer::cuda {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int P>
__device__ __forceinline__ void load_pack(const T* p, float (&v)[P]) {
  if constexpr (P == 1) {
    v[0] = to_float(p[0]);
  } else {
    constexpr int kPerWord = 16 / int(sizeof(T));
    static_assert(P % kPerWord == 0, "pack must be whole 16-byte words");
#pragma unroll
    for (int w = 0; w < P / kPerWord; ++w) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[w];
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int k = 0; k < kPerWord; ++k) v[w * kPerWord + k] = to_float(e[k]);
    }
  }
}

template <typename T, int P>
__device__ __forceinline__ void store_pack(T* p, const float (&v)[P]) {
  if constexpr (P == 1) {
    p[0] = from_float<T>(v[0]);
  } else {
    constexpr int kPerWord = 16 / int(sizeof(T));
    static_assert(P % kPerWord == 0, "pack must be whole 16-byte words");
#pragma unroll
    for (int w = 0; w < P / kPerWord; ++w) {
      uint4 u;
      T* e = reinterpret_cast<T*>(&u);
#pragma unroll
      for (int k = 0; k < kPerWord; ++k) e[k] = from_float<T>(v[w * kPerWord + k]);
      reinterpret_cast<uint4*>(p)[w] = u;
    }
  }
}

}  // namespace trainer::cuda
