// Every CUDA runtime / cuBLASLt call and kernel launch is checked; the error
// names the call or kernel and the shapes it ran on, so a failure on a
// 1000-GPU job says what broke without a debugger.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace trainer::cuda {

[[noreturn]] inline void cuda_fail(const char* what, const std::string& context, cudaError_t e) {
  throw std::runtime_error(std::string("CUDA error in ") + what + (context.empty() ? "" : " (" + context + ")") +
                           ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

[[noreturn]] inline void cublas_fail(const char* what, const std::string& context, cublasStatus_t s) {
  throw std::runtime_error(std::string("cuBLASLt error in ") + what + (context.empty() ? "" : " (" + context + ")") +
                           ": status " + std::to_string(int(s)));
}

}  // namespace trainer::cuda

// CUDA_CHECK(cudaMemcpyAsync(...), "context string")
#define CUDA_CHECK(call, context)                                                 \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) ::trainer::cuda::cuda_fail(#call, (context), e_);      \
  } while (0)

// After a <<<>>> launch: KERNEL_CHECK("rmsnorm_forward_kernel", "x [8192, 4096]")
#define KERNEL_CHECK(kernel_name, context)                                        \
  do {                                                                            \
    cudaError_t e_ = cudaGetLastError();                                          \
    if (e_ != cudaSuccess) ::trainer::cuda::cuda_fail(kernel_name, (context), e_);\
  } while (0)

#define CUBLAS_CHECK(call, context)                                                     \
  do {                                                                                  \
    cublasStatus_t s_ = (call);                                                         \
    if (s_ != CUBLAS_STATUS_SUCCESS) ::trainer::cuda::cublas_fail(#call, (context), s_);\
  } while (0)
