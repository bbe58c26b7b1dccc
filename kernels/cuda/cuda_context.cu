#include <mutex>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"

namespace trainer::cuda {

namespace {
// 32 MiB: cuBLASLt's recommendation for Hopper split-K and stream-K kernels.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct Context {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  int sms = 0;
};

Context& ctx() {
  static Context c;
  static std::once_flag once;
  std::call_once(once, [] {
    CUBLAS_CHECK(cublasLtCreate(&c.lt), "cuBLASLt handle");
    CUDA_CHECK(cudaMalloc(&c.workspace, kWorkspaceBytes), "cuBLASLt workspace");
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev), "");
    CUDA_CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev), "");
  });
  return c;
}
}  // namespace

cublasLtHandle_t cublaslt() { return ctx().lt; }
void* cublaslt_workspace() { return ctx().workspace; }
size_t cublaslt_workspace_bytes() { return kWorkspaceBytes; }
int sm_count() { return ctx().sms; }

}  // namespace trainer::cuda
