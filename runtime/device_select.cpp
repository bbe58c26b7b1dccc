#include "runtime/device_select.h"

#include <cstdio>

#include "config/config.h"

#ifdef TRAINER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace trainer {

int cuda_device_count(std::string* why) {
#ifdef TRAINER_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    return -1;
  }
  if (n == 0 && why) *why = "no devices visible";
  return n;
#else
  if (why) *why = "this build has no CUDA backend";
  return -1;
#endif
}

DeviceChoice select_device(const std::string& requested, int local_rank) {
  DeviceChoice c;
  if (requested == "cpu") {
    c.line = "device: cpu (train.device=cpu)";
    return c;
  }
  (void)local_rank;  // used only by the CUDA build
  std::string why;
  const int n = cuda_device_count(&why);
  if (n <= 0) {
    if (requested == "cuda")
      throw ConfigError("train.device: 'cuda' requested but no CUDA device can be used (" + why +
                        "); use train.device=cpu or auto");
    c.line = "device: cpu (no CUDA device: " + why + ")";
    return c;
  }
#ifdef TRAINER_HAVE_CUDA
  c.device = Device::CUDA;
  c.index = local_rank % n;
  cudaError_t e = cudaSetDevice(c.index);
  if (e != cudaSuccess)
    throw std::runtime_error("cudaSetDevice(" + std::to_string(c.index) + "): " + cudaGetErrorString(e));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, c.index);
  c.memory_bytes = prop.totalGlobalMem;
  char buf[512];
  std::snprintf(buf, sizeof buf, "device: cuda:%d (%s, %.1f GiB, sm_%d%d, %d SMs)", c.index, prop.name,
                double(prop.totalGlobalMem) / (1 << 30), prop.major, prop.minor, prop.multiProcessorCount);
  c.line = buf;
#endif
  return c;
}

DType storage_dtype(const std::string& precision, Device device) {
  if (device == Device::CPU) {
    if (precision == "auto" || precision == "fp32") return DType::F32;
    throw ConfigError("train.precision=" + precision +
                      " needs a GPU, but this run is on the CPU (whose backend computes in fp32); "
                      "use train.precision: fp32 or auto");
  }
  if (precision == "fp16") return DType::F16;
  if (precision == "fp32") return DType::F32;
  return DType::BF16;
}

}  // namespace trainer
