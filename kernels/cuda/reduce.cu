// Reductions of the CUDA backend (kernels/op_list.h): sum, sum_squares and
// checksum.
//
// Reductions (sum, sum_squares): two passes in fp64, deterministic. Pass 1:
// G blocks of 256 threads, G a function of n alone; thread t of block b takes
// packs t + b*256 + k*G*256 in k order, then the block reduces its threads in
// a fixed tree and writes one partial. Pass 2: one block adds the G partials
// in a fixed order. The order depends on n only (not on the GPU, the pointer
// alignment or timing), so the result is bitwise reproducible; fp64 keeps
// x^2 of any finite fp32 finite, and NaN/Inf propagate through the adds.
// Bytes: n*s read once, then one 8-byte copy to the host and a stream sync.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/checksum_math.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

constexpr int kPack = 8;                // elements per vector pack
constexpr int kReduceThreads = 256;
constexpr int kReduceMaxBlocks = 1024;  // pass 2 is one block of this many threads

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + dtype_name(t.dtype) + t.shape_str();
}

// ---- reductions ------------------------------------------------------------

// Grow-only device scratch for the reduction partials, allocated on first use
// and kept for the life of the process (freed with the context at exit).
// Reuse across calls is safe because every op runs on cuda::stream(): a later
// call's kernels start after an earlier call's kernels are done with it. One
// host thread issues the ops (the mutex only guards the allocation).
double* reduce_scratch() {
  static std::mutex mu;
  static double* p = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (p == nullptr)
    CUDA_CHECK(cudaMalloc(&p, sizeof(double) * (kReduceMaxBlocks + 1)), "sum/sum_squares partials");
  return p;
}

// Fixed-order block reduction: butterfly inside each warp, then thread 0 adds
// the warp totals in warp order. The result is valid in thread 0 only.
__device__ __forceinline__ double block_sum_to_thread0(double v) {
  TRAINER_SHARED(double, warp_total, [32]);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) warp_total[warp] = v;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
    const int warps = int(blockDim.x) / 32;
    for (int w = 0; w < warps; ++w) total += warp_total[w];
  }
  return total;
}

template <bool kSquare>
__device__ __forceinline__ double term(float x) {
  const double d = double(x);
  return kSquare ? d * d : d;
}

// kVec only changes how a pack is loaded, not which thread adds which element
// in which order, so the result does not depend on the pointer's alignment.
template <typename T, bool kSquare, bool kVec>
__global__ void __launch_bounds__(kReduceThreads)
    reduce_partials_kernel(const T* x, int64_t n, double* partials) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = n / kPack;
  double acc = 0;
  for (int64_t p = tid; p < packs; p += stride) {
    float v[kPack];
    if constexpr (kVec) {
      load_pack<T, kPack>(x + p * kPack, v);
    } else {
#pragma unroll
      for (int k = 0; k < kPack; ++k) v[k] = to_float(x[p * kPack + k]);
    }
#pragma unroll
    for (int k = 0; k < kPack; ++k) acc += term<kSquare>(v[k]);
  }
  // The last n % 8 (< 8 <= stride) elements: one each for the first threads.
  const int64_t i = packs * kPack + tid;
  if (i < n) acc += term<kSquare>(to_float(x[i]));
  const double total = block_sum_to_thread0(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void __launch_bounds__(kReduceMaxBlocks)
    reduce_final_kernel(const double* partials, int count, double* result) {
  double acc = 0;
  for (int i = int(threadIdx.x); i < count; i += int(blockDim.x)) acc += partials[i];
  const double total = block_sum_to_thread0(acc);
  if (threadIdx.x == 0) *result = total;
}

template <bool kSquare>
double reduce(const char* op, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const std::string context = describe("x", x);
  // ~4 packs per thread before the grid reaches its cap; a function of n only.
  const int64_t per_block = int64_t(kReduceThreads) * kPack * 4;
  const int blocks = int(std::clamp<int64_t>((n + per_block - 1) / per_block, 1, kReduceMaxBlocks));
  double* partials = reduce_scratch();
  double* result = partials + kReduceMaxBlocks;
  const bool vec = aligned16(x.data);
  DISPATCH_FLOAT(x.dtype, T, op, {
    const T* p = static_cast<const T*>(x.data);
    if (vec)
      launch(reduce_partials_kernel<T, kSquare, true>, blocks, kReduceThreads, 0, stream(), p, n,
             partials);
    else
      launch(reduce_partials_kernel<T, kSquare, false>, blocks, kReduceThreads, 0, stream(), p, n,
             partials);
    KERNEL_CHECK("reduce_partials_kernel", std::string(op) + " " + context);
  });
  launch(reduce_final_kernel, 1, kReduceMaxBlocks, 0, stream(), partials, blocks, result);
  KERNEL_CHECK("reduce_final_kernel", std::string(op) + " " + context);
  double host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, stream()),
             std::string(op) + " result " + context);
  CUDA_CHECK(cudaStreamSynchronize(stream()), std::string(op) + " " + context);
  return host;
}

// ---- checksum ----------------------------------------------------------------

// One 64-bit integer sum: each warp adds its threads' terms, its lane 0 adds
// that to the result atomically. Integer addition is associative, so the
// grid, the order and the timing cannot change the value. Word i is bytes
// [4i, 4i + 4), zero-padded past the end; an unaligned tensor is read a byte
// at a time.
template <bool kAligned>
__global__ void __launch_bounds__(kReduceThreads)
    checksum_kernel(const unsigned char* bytes, int64_t n, unsigned long long* result) {
  const int64_t words = (n + 3) / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  unsigned long long acc = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride) {
    uint32_t w = 0;
    if (kAligned && 4 * i + 4 <= n) {
      w = reinterpret_cast<const uint32_t*>(bytes)[i];
    } else {
      for (int k = 0; k < 4 && 4 * i + k < n; ++k) w |= uint32_t(bytes[4 * i + k]) << (8 * k);
    }
    acc += checksum_math::term(w, uint64_t(i));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) atomicAdd(result, acc);
}

unsigned long long* checksum_scratch() {
  static std::mutex mu;
  static unsigned long long* p = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (p == nullptr) CUDA_CHECK(cudaMalloc(&p, sizeof(unsigned long long)), "checksum result");
  return p;
}

}  // namespace

uint64_t checksum(Tensor x) {
  const int64_t n = int64_t(x.nbytes());
  if (n == 0) return checksum_math::finish(0, 0);
  const std::string context = describe("x", x);
  unsigned long long* result = checksum_scratch();
  CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(unsigned long long), stream()), "checksum " + context);
  const int64_t words = (n + 3) / 4;
  const int blocks = int(std::clamp<int64_t>((words + kReduceThreads - 1) / kReduceThreads, 1, kReduceMaxBlocks));
  const auto* p = static_cast<const unsigned char*>(x.data);
  if (reinterpret_cast<uintptr_t>(p) % 4 == 0)
    launch(checksum_kernel<true>, blocks, kReduceThreads, 0, stream(), p, n, result);
  else
    launch(checksum_kernel<false>, blocks, kReduceThreads, 0, stream(), p, n, result);
  KERNEL_CHECK("checksum_kernel", "checksum " + context);
  unsigned long long host = 0;
  CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(host), cudaMemcpyDeviceToHost, stream()), "checksum " + context);
  CUDA_CHECK(cudaStreamSynchronize(stream()), "checksum " + context);
  return checksum_math::finish(uint64_t(host), uint64_t(n));
}

double sum_squares(Tensor x) { return reduce<true>("sum_squares", x); }

double sum(Tensor x) { return reduce<false>("sum", x); }

}  // namespace trainer::cuda
