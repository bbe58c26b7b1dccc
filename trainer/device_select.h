// train.device: auto picks CUDA when a GPU answers and the CUDA backend is
// built, else the CPU, and says which in one line.
#pragma once

#include <string>

#include "kernels/tensor.h"

namespace trainer {

struct DeviceChoice {
  Device device = Device::CPU;
  std::string line;  // "device: cpu (no CUDA device: ...)"
};

// Throws ConfigError when train.device=cuda cannot be honoured.
DeviceChoice select_device(const std::string& requested);
// Number of visible CUDA devices, or -1 with the reason in *why.
int cuda_device_count(std::string* why);

}  // namespace trainer
