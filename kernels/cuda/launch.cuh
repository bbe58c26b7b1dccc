// Every kernel launch of the module goes through launch(), the one place the
// emulated device (TRAINER_CUDA_EMU, a host compiler's build) has to replace
// <<<>>>, which only nvcc understands:
//
//   launch(rope_kernel<T>, grid, kThreads, 0, stream(), out, inp, ...);
//   KERNEL_CHECK("rope_kernel", context);   // checked by the caller, as before
//
// The kernel is passed as the instantiated function (rope_kernel<T>), so its
// parameter types are known here and the arguments convert to them exactly
// as they did in the <<<>>> call.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#ifdef TRAINER_CUDA_EMU
#include "emu/runtime_launch.h"
#endif

namespace trainer::cuda {

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "launch: one argument per kernel parameter");
#ifndef TRAINER_CUDA_EMU
  kernel<<<grid, block, smem, stream>>>(std::forward<Args>(args)...);
#else
  // Every CUDA thread calls the kernel with its own copies of the converted
  // arguments, as each thread of a <<<>>> launch sees the parameters; errors
  // reach cudaGetLastError() as a launch's would.
  ::trainer::emu::launch_kernel(reinterpret_cast<const void*>(kernel), grid, block, smem, stream,
                                [&] { kernel(args...); });
#endif
}

}  // namespace trainer::cuda
