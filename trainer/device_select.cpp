#include "trainer/device_select.h"

#include "trainer/config.h"

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

DeviceChoice select_device(const std::string& requested) {
  DeviceChoice c;
  if (requested == "cpu") {
    c.line = "device: cpu (train.device=cpu)";
    return c;
  }
  std::string why;
  const int n = cuda_device_count(&why);
  // The CUDA kernels are not part of this build yet: a visible GPU is reported
  // but the model still runs on the CPU reference backend.
  const std::string reason = n > 0 ? std::to_string(n) + " CUDA device(s) visible, but the CUDA op backend is not built yet"
                                   : "no CUDA device: " + why;
  if (requested == "cuda")
    throw ConfigError("train.device: 'cuda' requested but CUDA cannot be used (" + reason +
                      "); use train.device=cpu or auto");
  c.line = "device: cpu (" + reason + ")";
  return c;
}

}  // namespace trainer
