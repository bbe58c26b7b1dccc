// The one CUDA stream every device operation of this process is ordered on:
// kernels, host<->device copies, memsets, and the NCCL collectives' waits.
// Created on first use on the current device (LOCAL_RANK picks the device
// before any op runs). Only in builds with the CUDA backend.
#pragma once

#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>

namespace trainer::cuda {

cudaStream_t stream();
// Waits for the compute stream (host reads of results).
void synchronize();

}  // namespace trainer::cuda
#endif
