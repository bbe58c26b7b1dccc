#include "kernels/cuda/compute_stream.h"

#include <mutex>

#include "kernels/cuda/cuda_check.h"

namespace trainer::cuda {

cudaStream_t stream() {
  static cudaStream_t s = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the compute stream");
  });
  return s;
}

void synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream()), "waiting for the compute stream"); }

}  // namespace trainer::cuda
