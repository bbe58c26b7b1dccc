// A kernel launch on the emulated CUDA device, what <<<grid, block, smem,
// stream>>> is to nvcc (kernels/cuda/launch.cuh calls it). Part of the
// emulated CUDA runtime (emu/runtime_*.cpp), built into the emulated module.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace trainer::emu {

// Runs `body` (the kernel called with its arguments) once per CUDA thread of
// `grid` x `block` on the SIMT executor, in order on `stream`, and returns
// when it has finished: every launch is synchronous here. What CUDA reports
// through cudaGetLastError() after a <<<>>> launch goes there too: a bad
// configuration (cudaErrorInvalidConfiguration), more dynamic shared memory
// than the kernel may have (cudaErrorInvalidValue; above 48 KiB it needs
// cudaFuncSetAttribute's opt-in), a fault in the kernel (cudaErrorLaunchFailure,
// or cudaErrorIllegalAddress for a write into an allocation's guard zone;
// both sticky, as a GPU's are). cudaGetErrorString() then carries the
// emulator's message. `kernel` (the function's address) names the kernel in
// messages and keys its attributes.
void launch_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const std::function<void()>& body);

}  // namespace trainer::emu
