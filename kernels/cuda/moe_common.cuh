// Shared by the MoE files of the CUDA backend (moe_routing.cu,
// moe_permute.cu): launch sizes and one grow-only device scratch buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"

namespace trainer::cuda::moe_detail {

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

inline unsigned blocks_for(int64_t work, int per_block) {
  const int64_t blocks = (work + per_block - 1) / per_block;
  const int64_t cap = int64_t(sm_count()) * 64;  // grid-stride loops cover the rest
  return unsigned(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// Held by a caller of scratch() until its kernels using the buffer are enqueued.
inline std::mutex& scratch_mutex() {
  static std::mutex mu;
  return mu;
}

// Grow-only device scratch (inverse maps, counts), one buffer for every MoE
// op (an inline function: one instance in the program). Growth is
// stream-ordered (cudaFreeAsync / cudaMallocAsync on the compute stream), so
// kernels still using the old buffer finish first.
inline void* scratch(size_t bytes, const char* op) {
  static void* buf = nullptr;
  static size_t cap = 0;
  if (bytes > cap) {
    if (buf) CUDA_CHECK(cudaFreeAsync(buf, stream()), std::string(op) + ": scratch");
    buf = nullptr;
    cap = 0;
    size_t want = bytes < (size_t(1) << 20) ? (size_t(1) << 20) : bytes;
    CUDA_CHECK(cudaMallocAsync(&buf, want, stream()), std::string(op) + ": scratch of " + std::to_string(want) + " bytes");
    cap = want;
  }
  return buf;
}

}  // namespace trainer::cuda::moe_detail
