// The one CUDA stream every device operation of this process is ordered on:
// kernels, host<->device copies, memsets, and the NCCL collectives' waits.
// Created on first use on the current device (select_device picks the device
// before any op runs). Part of the CUDA module (core/cuda_module.h).
#pragma once

#include <cuda_runtime_api.h>

namespace trainer::cuda {

cudaStream_t stream();
// Waits for the compute stream (host reads of results).
void synchronize();

}  // namespace trainer::cuda
