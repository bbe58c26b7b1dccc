// The module's device runtime table (core/cuda_backend.h), filled with the
// functions of device_info.cpp, device_memory.cpp and compute_stream.cpp;
// core/cuda_backend.cpp fetches it through the loader.
#include "core/cuda_backend.h"
#include "kernels/cuda/compute_stream.h"
#include "kernels/cuda/device_api.h"

namespace trainer::cuda {
namespace {

CudaBackend make_runtime_table() {
  CudaBackend t;
  t.abi_version = kCudaBackendAbi;
  t.signature = kCudaBackendSignature;
  t.table_bytes = sizeof(CudaBackend);
  t.describe = &describe;
  t.device_count = &device_count;
  t.set_device = &set_device;
  t.device_info = &device_info;
  t.alloc = &alloc;
  t.release = &release;
  t.transfer = &transfer;
  t.synchronize = &synchronize;
  return t;
}

}  // namespace
}  // namespace trainer::cuda

extern "C" __attribute__((visibility("default"))) const trainer::CudaTable* trainer_cuda_backend() {
  static const trainer::CudaBackend table = trainer::cuda::make_runtime_table();
  return &table;
}
