#include "kernels/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace trainer {

namespace {
constexpr size_t kAlign = 64;

#ifdef TRAINER_HAVE_CUDA
void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA error in " + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
#else
[[noreturn]] void no_cuda(const std::string& what) {
  throw std::logic_error(what + ": CUDA memory requested, but this build has no CUDA backend");
}
#endif
}  // namespace

void* device_alloc(size_t bytes, Device d, const std::string& label) {
  if (bytes == 0) return nullptr;
  if (d == Device::CPU) {
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p) throw std::runtime_error("out of host memory: " + label + " needs " + std::to_string(bytes) + " bytes");
    std::memset(p, 0, rounded);
    return p;
  }
#ifdef TRAINER_HAVE_CUDA
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw std::runtime_error("out of GPU memory: " + label + " needs " + std::to_string(bytes) + " bytes, " +
                             std::to_string(free_b) + " of " + std::to_string(total_b) +
                             " free (see the memory plan above; try parallel.zero_stage, smaller "
                             "train.micro_batch_size or recompute)");
  }
  check(cudaMemset(p, 0, bytes), "cudaMemset(" + label + ")");
  return p;
#else
  no_cuda(label);
#endif
}

void device_free(void* p, Device d) {
  if (!p) return;
  if (d == Device::CPU) {
    std::free(p);
    return;
  }
#ifdef TRAINER_HAVE_CUDA
  cudaFree(p);  // no throw from destructors
#endif
}

void copy_between_devices(Tensor dst, Tensor src) {
  if (dst.dtype != src.dtype || dst.numel() != src.numel())
    throw std::invalid_argument("copy " + std::string(device_name(src.device)) + " -> " + device_name(dst.device) +
                                ": " + dtype_name(src.dtype) + src.shape_str() + " vs " + dtype_name(dst.dtype) +
                                dst.shape_str());
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::memmove(dst.data, src.data, src.nbytes());
    return;
  }
#ifdef TRAINER_HAVE_CUDA
  // cudaMemcpy with cudaMemcpyDefault works out the direction from the
  // pointers and waits for prior work on the legacy stream; the compute
  // stream is synchronised first so that results written there are visible.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before a copy");
  check(cudaMemcpy(dst.data, src.data, src.nbytes(), cudaMemcpyDefault), "cudaMemcpy " + src.shape_str());
  // From pageable host memory cudaMemcpy may return before the DMA lands, and
  // the compute stream is non-blocking (it does not wait on the legacy
  // stream): wait here so the next kernel reads the new bytes.
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize after a copy");
#else
  no_cuda("copy " + src.shape_str());
#endif
}

void read_to_host(Tensor src, void* host_dst) {
  Tensor dst = src;
  dst.data = host_dst;
  dst.device = Device::CPU;
  copy_between_devices(dst, src);
}

void write_from_host(Tensor dst, const void* host_src) {
  Tensor src = dst;
  src.data = const_cast<void*>(host_src);
  src.device = Device::CPU;
  copy_between_devices(dst, src);
}

}  // namespace trainer
