#include "kernels/cuda_ops_table.h"

#include "core/cuda_module.h"

namespace trainer {

const CudaOpsTable* cuda_ops_table(std::string* why) {
  struct Fetched {
    const CudaOpsTable* table = nullptr;
    std::string why;
  };
  // Fetched and checked once: the router asks for it on every CUDA op.
  static const Fetched f = [] {
    Fetched r;
    r.table = static_cast<const CudaOpsTable*>(cuda_module_table(kCudaOpsSpec, &r.why));
    return r;
  }();
  if (!f.table && why) *why = f.why;
  return f.table;
}

}  // namespace trainer
