// The arithmetic of ops::checksum (kernels/op_list.h), shared by the CPU and
// the CUDA backend so that a value is the same wherever it was taken.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TRAINER_CHECKSUM_FN __host__ __device__ __forceinline__
#else
#define TRAINER_CHECKSUM_FN inline
#endif

namespace trainer::checksum_math {

// SplitMix64's finaliser: every input bit reaches every output bit.
TRAINER_CHECKSUM_FN uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Word i's share of the sum: its position enters so that swapped words differ.
TRAINER_CHECKSUM_FN uint64_t term(uint32_t word, uint64_t index) {
  return mix(uint64_t(word) + index * 0x9E3779B97F4A7C15ull);
}

TRAINER_CHECKSUM_FN uint64_t finish(uint64_t sum, uint64_t bytes) { return mix(sum ^ mix(bytes)); }

}  // namespace trainer::checksum_math
