// train.device: auto picks CUDA when a GPU answers and the CUDA backend is
// built, else the CPU, and says which in one line. train.precision picks the
// storage type of weights, gradients and activations on that device.
#pragma once

#include <cstddef>
#include <string>

#include "core/cuda_backend.h"
#include "core/tensor.h"

namespace trainer {

struct DeviceChoice {
  Device device = Device::CPU;
  int index = 0;             // CUDA device ordinal (LOCAL_RANK later)
  size_t memory_bytes = 0;   // device memory (0: unknown / host)
  std::string line;          // "device: cpu (no CUDA device: ...)"
};

// Throws ConfigError when train.device=cuda cannot be honoured.
DeviceChoice select_device(const std::string& requested, int local_rank = 0);
// The CUDA module's device runtime once all three of its tables (device
// runtime, ops: kernels/cuda_ops_table.h, NCCL: comm/nccl_table.h) have been
// fetched and checked, so that a stale module is refused when a device is
// chosen, naming the table, rather than at the first op or process group.
// Loads the module; nullptr with the reason in *why.
const CudaBackend* usable_cuda_module(std::string* why);
// Number of visible CUDA devices, or -1 with the reason in *why. Asks the
// driver first (runtime/cuda_driver.h) and loads the CUDA module only when it
// has devices.
int cuda_device_count(std::string* why);
// auto: BF16 on a GPU, F32 on the CPU; fp16 -> F16; fp32 -> F32. Throws
// ConfigError for a 16-bit precision on the CPU (whose backend is fp32).
DType storage_dtype(const std::string& precision, Device device);

}  // namespace trainer
