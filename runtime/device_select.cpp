#include "runtime/device_select.h"

#include <cstdio>

#include "comm/nccl_table.h"
#include "config/config.h"
#include "core/cuda_backend.h"
#include "core/cuda_module.h"
#include "kernels/cuda_ops_table.h"
#include "runtime/cuda_driver.h"

namespace trainer {

const CudaBackend* usable_cuda_module(std::string* why) {
  const CudaBackend* cuda = cuda_backend(why);
  if (!cuda || !cuda_ops_table(why) || !nccl_table(why)) return nullptr;
  return cuda;
}

int cuda_device_count(std::string* why) {
  std::string reason;
  int n = -1;
  if (!cuda_module_built()) {
    reason = "this build has no CUDA backend";
  } else if (!cuda_module_emulated() && probe_cuda_driver().devices <= 0) {
    // No driver, or no device: the module (and libcublasLt with it) stays
    // unloaded. The emulated device's module needs neither.
    n = probe_cuda_driver().devices;
    reason = probe_cuda_driver().why;
  } else if (const CudaBackend* cuda = usable_cuda_module(&reason)) {
    // The runtime's count, which CUDA_VISIBLE_DEVICES and a driver too old
    // for the runtime can still bring to nothing.
    n = cuda->device_count(&reason);
    if (n == 0 && reason.empty()) reason = "no devices visible";
  }
  if (why) *why = reason;
  return n;
}

DeviceChoice select_device(const std::string& requested, int local_rank) {
  DeviceChoice c;
  if (requested == "cpu") {
    c.line = "device: cpu (train.device=cpu)";
    return c;
  }
  std::string why;
  const int n = cuda_device_count(&why);
  if (n <= 0) {
    if (requested == "cuda")
      throw ConfigError("train.device: 'cuda' requested but no CUDA device can be used (" + why +
                        "); use train.device=cpu or auto");
    c.line = "device: cpu (no CUDA device: " + why + ")";
    return c;
  }
  const CudaBackend& cuda = *cuda_backend(nullptr);  // loaded by the count
  c.device = Device::CUDA;
  c.index = local_rank % n;
  cuda.set_device(c.index);
  const CudaDeviceInfo prop = cuda.device_info(c.index);
  c.memory_bytes = prop.memory_bytes;
  char buf[512];
  std::snprintf(buf, sizeof buf, "device: cuda:%d (%s, %.1f GiB, sm_%d%d, %d SMs)", c.index, prop.name.c_str(),
                double(prop.memory_bytes) / (1 << 30), prop.major, prop.minor, prop.multiprocessors);
  c.line = buf;
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
