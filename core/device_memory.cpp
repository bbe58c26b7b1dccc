#include "core/device_memory.h"

#include "core/host_memory.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <mutex>

#include "core/compute_stream.h"
#endif

namespace trainer {

namespace {

#ifdef TRAINER_HAVE_CUDA
void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess)
    throw std::runtime_error("CUDA error in " + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Small host->device copies (the micro-batch's token ids and targets) go
// through one pinned staging buffer, so the copy is truly asynchronous on
// the compute stream: the caller's (pageable) buffer is free on return and
// no synchronisation happens, except waiting for the previous staged copy
// before the buffer is reused. Large ones (weights at start-up, checkpoint
// restores) are copied directly and waited for.
constexpr size_t kStagingMax = size_t(64) << 20;

class Staging {
 public:
  void upload(void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate (staging)");
    check(cudaEventSynchronize(done_), "waiting for the previous staged upload");
    if (bytes > capacity_) {
      if (buf_) cudaFreeHost(buf_);
      buf_ = nullptr;
      capacity_ = 0;
      const size_t cap = std::max(bytes, size_t(1) << 20);
      check(cudaHostAlloc(&buf_, cap, cudaHostAllocDefault), "cudaHostAlloc (" + std::to_string(cap) + " bytes of staging)");
      capacity_ = cap;
    }
    std::memcpy(buf_, src, bytes);
    check(cudaMemcpyAsync(dst, buf_, bytes, cudaMemcpyHostToDevice, cuda::stream()), "cudaMemcpyAsync (staged upload)");
    check(cudaEventRecord(done_, cuda::stream()), "cudaEventRecord (staged upload)");
  }

 private:
  std::mutex mu_;
  void* buf_ = nullptr;
  size_t capacity_ = 0;
  cudaEvent_t done_ = nullptr;
};

Staging& staging() {
  static Staging* s = new Staging;  // never destroyed: the CUDA runtime may be gone at exit
  return *s;
}
#else
[[noreturn]] void no_cuda(const std::string& what) {
  throw std::logic_error(what + ": CUDA memory requested, but this build has no CUDA backend");
}
#endif
}  // namespace

void* device_alloc(size_t bytes, Device d, const std::string& label) {
  if (bytes == 0) return nullptr;
  if (d == Device::CPU) return host_alloc_zeroed(bytes, label);
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
  // On the compute stream, which every kernel and collective is ordered
  // after (the legacy stream's cudaMemset is not: the compute stream is
  // non-blocking).
  check(cudaMemsetAsync(p, 0, bytes, cuda::stream()), "cudaMemsetAsync(" + label + ")");
  return p;
#else
  no_cuda(label);
#endif
}

void device_free(void* p, Device d) {
  if (!p) return;
  if (d == Device::CPU) return host_free(p);
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
  // Every copy is ordered on the compute stream like the ops: after the
  // kernels queued before it (collectives are joined into that stream before
  // their results are used), before the ones queued after. Only a copy to
  // the host waits, for its own bytes.
  const size_t n = src.nbytes();
  if (n == 0) return;
  if (src.device == Device::CPU && n <= kStagingMax) {
    staging().upload(dst.data, src.data, n);
    return;
  }
  check(cudaMemcpyAsync(dst.data, src.data, n, cudaMemcpyDefault, cuda::stream()), "cudaMemcpyAsync " + src.shape_str());
  if (dst.device == Device::CPU || src.device == Device::CPU)
    check(cudaStreamSynchronize(cuda::stream()), "waiting for the copy of " + src.shape_str());
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
