// Per-process CUDA state shared by every op: the compute stream, the
// cuBLASLt handle and its workspace. Created on first use on the current
// device (LOCAL_RANK picks the device before any op runs).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace trainer::cuda {

cudaStream_t stream();
cublasLtHandle_t cublaslt();
void* cublaslt_workspace();
size_t cublaslt_workspace_bytes();
int sm_count();
// Waits for the compute stream (host reads of results).
void synchronize();

}  // namespace trainer::cuda
