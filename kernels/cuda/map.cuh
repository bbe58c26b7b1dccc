// Elementwise maps: a grid-stride loop that hands each thread 16-byte packs
// of kMapPack elements while the pointers allow it (vec), then single
// elements for the tail. Op supplies `template <int P> apply(int64_t i)`.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.cuh"

namespace trainer::cuda {

constexpr int kMapPack = 8;
constexpr int kMapThreads = 256;
constexpr int64_t kMapMaxBlocks = 65536;  // grid-stride loops cover the rest

template <typename Op>
__global__ void __launch_bounds__(kMapThreads) map_kernel(const Op op, int64_t n, bool vec) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vec) {
    const int64_t packs = n / kMapPack;
    for (int64_t p = tid; p < packs; p += stride) op.template apply<kMapPack>(p * kMapPack);
    done = packs * kMapPack;
  }
  for (int64_t i = done + tid; i < n; i += stride) op.template apply<1>(i);
}

template <typename Op>
void launch_map(const char* kernel, const Op& op, int64_t n, bool vec, const std::string& context) {
  if (n <= 0) return;
  const int64_t units = vec ? n / kMapPack + n % kMapPack : n;
  const int64_t blocks = std::min((units + kMapThreads - 1) / kMapThreads, kMapMaxBlocks);
  launch(map_kernel<Op>, unsigned(blocks), kMapThreads, 0, stream(), op, n, vec);
  KERNEL_CHECK(kernel, context);
}

}  // namespace trainer::cuda
