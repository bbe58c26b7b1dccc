#include "kernels/cuda_ops_table.h"

#include "core/cuda_module.h"

namespace trainer {

const CudaOpsTable* cuda_ops_table(std::string* why) {
  // Fetched and checked once: the router asks for it on every CUDA op.
  return kept_cuda_module_table<CudaOpsTable>(kCudaOpsSpec, why);
}

}  // namespace trainer
