// The emulated device's <cuda_runtime.h> (TRAINER_CUDA_EMU: kernels/cuda
// compiled by the host C++ compiler, this directory first on the include
// path). nvcc gives every .cu file the device language for free; a host
// compiler gets it from here:
//
// - the host runtime API, types and 16-bit floats are the toolkit's own
//   headers (#include_next, the toolkit's include directory after this one):
//   they compile with g++, and their cudaError_t, cudaDeviceProp, dim3 and
//   cudaMemcpyKind are the real ones, so the emulated runtime (emu/runtime_*)
//   implements the very declarations libcudart would, and the toolkit's own
//   headers that include "cuda_runtime_api.h" by quotes (vector_functions.h,
//   which cuda_bf16.h pulls in) meet no second, conflicting definition;
// - what only device code has (threadIdx, __syncthreads, warp shuffles,
//   atomics, the device math intrinsics, __launch_bounds__) comes from emu/,
//   mapped onto the SIMT executor (emu/simt.h).
//
// __CUDACC__ stays undefined: the toolkit's headers then declare host code
// only, and the device declarations below are the sole ones.
#pragma once

#include_next <cuda_runtime.h>

#include "emu/cuda_device_atomics.h"
#include "emu/cuda_device_builtins.h"
#include "emu/cuda_device_math.h"

// The toolkit declares this C++ overload only for nvcc (__CUDACC__): a
// kernel passed as itself rather than as const void*.
template <class T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
