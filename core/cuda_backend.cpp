#include "core/cuda_backend.h"

#include "core/cuda_module.h"

namespace trainer {

const CudaBackend* cuda_backend(std::string* why) {
  // Fetched and checked once: device memory asks for it on every allocation.
  return kept_cuda_module_table<CudaBackend>(kCudaBackendSpec, why);
}

}  // namespace trainer
