#include "core/cuda_backend.h"

#include "core/cuda_module.h"

namespace trainer {

const CudaBackend* cuda_backend(std::string* why) {
  struct Fetched {
    const CudaBackend* table = nullptr;
    std::string why;
  };
  // Fetched and checked once: device memory asks for it on every allocation.
  static const Fetched f = [] {
    Fetched r;
    r.table = static_cast<const CudaBackend*>(cuda_module_table(kCudaBackendSpec, &r.why));
    return r;
  }();
  if (!f.table && why) *why = f.why;
  return f.table;
}

}  // namespace trainer
