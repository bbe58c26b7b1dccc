// Whether this machine has a CUDA driver with devices, asked of the driver
// itself (libcuda.so.1 through dlopen: cuInit, cuDeviceGetCount) before
// train.device=auto loads the CUDA module. The module maps libcublasLt and
// the CUDA runtime (~150 MiB resident), which a machine without a GPU would
// pay for nothing; the driver library is small, and absent there.
#pragma once

#include <string>

namespace trainer {

struct CudaDriverProbe {
  int devices = -1;   // -1: no usable driver (why says what failed)
  int version = 0;    // cuDriverGetVersion, e.g. 12080 (0: unknown)
  std::string why;    // "no CUDA driver: libcuda.so.1: cannot open shared object file: ..."
};

// Probes once per process (thread-safe); later calls return the same answer.
// Never loads the CUDA module.
const CudaDriverProbe& probe_cuda_driver();

}  // namespace trainer
