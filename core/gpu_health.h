// What NVML says about one GPU at one moment (runtime/nvml.h reads it,
// observe/gpu_report.h judges and prints it): why a rank may be slow.
#pragma once

#include <cstdint>

namespace trainer {

struct GpuHealth {
  bool read = false;               // NVML answered for this sample
  double sm_mhz = 0, sm_max_mhz = 0;
  double temperature_c = 0;
  double power_w = 0, power_limit_w = 0;
  double memory_used_gib = 0;
  uint64_t throttle = 0;           // NVML's clock event (throttle) reasons, a bit mask
  uint64_t ecc_uncorrected = 0;    // volatile count, since the driver loaded
};

}  // namespace trainer
