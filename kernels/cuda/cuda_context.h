// Per-process CUDA state shared by every op: the compute stream
// (kernels/cuda/compute_stream.h, which the copies use too), the cuBLASLt handle
// and its workspace. Created on first use on the current device (LOCAL_RANK
// picks the device before any op runs).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/compute_stream.h"

namespace trainer::cuda {

cublasLtHandle_t cublaslt();
void* cublaslt_workspace();
size_t cublaslt_workspace_bytes();
int sm_count();

}  // namespace trainer::cuda
