// Device memory and every copy that touches it, all ordered on the compute
// stream (core/device_memory.h is the interface).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "kernels/cuda/compute_stream.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_api.h"

namespace trainer::cuda {

namespace {

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
    if (!done_) CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "staging");
    CUDA_CHECK(cudaEventSynchronize(done_), "waiting for the previous staged upload");
    if (bytes > capacity_) {
      if (buf_) cudaFreeHost(buf_);
      buf_ = nullptr;
      capacity_ = 0;
      const size_t cap = std::max(bytes, size_t(1) << 20);
      CUDA_CHECK(cudaHostAlloc(&buf_, cap, cudaHostAllocDefault), std::to_string(cap) + " bytes of staging");
      capacity_ = cap;
    }
    std::memcpy(buf_, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, buf_, bytes, cudaMemcpyHostToDevice, stream()), "staged upload");
    CUDA_CHECK(cudaEventRecord(done_, stream()), "staged upload");
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

}  // namespace

void* alloc(size_t bytes, const std::string& label) {
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
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream()), label);
  return p;
}

void release(void* p) { cudaFree(p); }  // no throw: called from destructors

void transfer(Tensor dst, Tensor src) {
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
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, n, cudaMemcpyDefault, stream()), "copy " + src.shape_str());
  if (dst.device == Device::CPU || src.device == Device::CPU)
    CUDA_CHECK(cudaStreamSynchronize(stream()), "waiting for the copy of " + src.shape_str());
}

}  // namespace trainer::cuda
