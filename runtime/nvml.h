// NVML, the driver's management library, loaded with dlopen as the CUDA
// module is (no link-time dependency; a CPU run never loads it): per rank
// its GPU's SM clock against the maximum, temperature, power against the
// limit, the active throttle reasons, uncorrected ECC errors and memory in
// use (core/gpu_health.h), for the rank monitor and the ECC check.
//
// TRAINER_NVML_LIBRARY names another library with NVML's functions (the
// tests' stand-in, tests/nvml_standin.cpp, which scripts a device); it is
// then read on a CPU run too. The device is the CUDA ordinal (LOCAL_RANK);
// NVML numbers devices in PCI order, which CUDA does too under
// CUDA_DEVICE_ORDER=PCI_BUS_ID.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/gpu_health.h"

namespace trainer {

class NvmlReader {
 public:
  // nullptr, with `why` saying so, when NVML cannot be loaded or does not know the device.
  static std::unique_ptr<NvmlReader> open(int device, std::string* why);
  ~NvmlReader();
  NvmlReader(const NvmlReader&) = delete;
  NvmlReader& operator=(const NvmlReader&) = delete;

  // Every field NVML answers; one it refuses (a GPU without ECC) stays 0.
  GpuHealth read();
  // The uncorrected ECC count alone (the per-step check); 0 when unsupported.
  uint64_t ecc_uncorrected();
  const std::string& library() const { return library_; }

 private:
  struct Api;
  NvmlReader() = default;
  void* lib_ = nullptr;
  void* device_ = nullptr;
  std::unique_ptr<Api> api_;
  std::string library_;
};

}  // namespace trainer
