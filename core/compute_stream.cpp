#include "core/compute_stream.h"

#ifdef TRAINER_HAVE_CUDA
#include <mutex>
#include <stdexcept>
#include <string>

namespace trainer::cuda {

namespace {
void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
}
}  // namespace

cudaStream_t stream() {
  static cudaStream_t s = nullptr;
  static std::once_flag once;
  std::call_once(once, [] { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "creating the compute stream"); });
  return s;
}

void synchronize() { check(cudaStreamSynchronize(stream()), "waiting for the compute stream"); }

}  // namespace trainer::cuda
#endif
