// Devices as the CUDA runtime sees them, and what the module was built with.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_api.h"

namespace trainer::cuda {

namespace {
std::string major_minor(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
}  // namespace

// Nothing here needs a driver: `trainer devices` describes the module on any
// machine. NCCL's version is the NCCL table's (comm/nccl_table.h), which
// `trainer devices` appends.
std::string describe() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string text = "CUDA runtime " + major_minor(runtime) + " (built with " + major_minor(CUDART_VERSION) +
                     "), cuBLASLt " + std::to_string(cublasLtGetVersion());
#ifdef TRAINER_EMU_CUBLASLT
  // The version numbers are the toolkit's headers'; what runs is the emulator.
  text = "emulated: " + text + " (" + TRAINER_EMU_CUBLASLT_DESCRIPTION + ")";
#endif
  return text;
}

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    return -1;
  }
  if (n == 0 && why) *why = "no devices visible";
  return n;
}

void set_device(int index) { CUDA_CHECK(cudaSetDevice(index), "device " + std::to_string(index)); }

CudaDeviceInfo device_info(int index) {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index), "device " + std::to_string(index));
  CudaDeviceInfo d;
  d.name = prop.name;
  d.memory_bytes = prop.totalGlobalMem;
  d.major = prop.major;
  d.minor = prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  return d;
}

}  // namespace trainer::cuda
