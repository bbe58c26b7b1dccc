// The CUDA module's device runtime as core sees it: the table of function
// pointers that libtrainer_cuda.so fills (kernels/cuda/runtime_table_entry.cpp)
// for device memory, copies and device choice. The module is loaded with
// dlopen the first time a run needs CUDA (core/cuda_module.*); only it links
// libcudart, libcublasLt and libnccl, so a CPU run never maps them (~150 MiB
// of libcublasLt alone). The ops and NCCL have tables of their own, declared
// by their layers (kernels/cuda_ops_table.h, comm/nccl_table.h).
//
// No CUDA header here: code outside the module never needs one.
#pragma once

#include <cstddef>
#include <string>

#include "core/cuda_table.h"
#include "core/tensor.h"

namespace trainer {

// Bump by hand when something outside the list changes meaning (the
// signature hash covers the list's text, not what the functions do).
// 2: the ops and NCCL moved to tables of their own.
inline constexpr int kCudaBackendAbi = 2;
// The module's exported C function that returns this table.
inline constexpr const char* kCudaBackendEntry = "trainer_cuda_backend";

struct CudaDeviceInfo {
  std::string name;
  size_t memory_bytes = 0;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
};

// (return type, name, (parameters)). Functions throw std::runtime_error
// naming the CUDA call that failed.
//   describe        "CUDA runtime 13.0 (built with 13.0), cuBLASLt 130100" (no
//                   driver needed; NCCL's version is comm's table's)
//   device_count    cudaGetDeviceCount: n, or -1 with the runtime's reason in *why
//   set_device      cudaSetDevice for this thread and every later CUDA call
//   alloc/release   device memory, zeroed on the compute stream (an out-of-memory
//                   error names `label` and the free bytes)
//   transfer        dst <- src between devices, same nbytes, ordered on the
//                   compute stream (core/device_memory.h says when it returns)
//   synchronize     waits for the compute stream
#define TRAINER_CUDA_BACKEND_CALLS(X)                       \
  X(std::string, describe, ())                              \
  X(int, device_count, (std::string * why))                 \
  X(void, set_device, (int index))                          \
  X(CudaDeviceInfo, device_info, (int index))               \
  X(void*, alloc, (size_t bytes, const std::string& label)) \
  X(void, release, (void* p))                               \
  X(void, transfer, (Tensor dst, Tensor src))               \
  X(void, synchronize, ())

inline constexpr uint64_t kCudaBackendSignature =
    cuda_table_hash("runtime;" TRAINER_CUDA_BACKEND_CALLS(TRAINER_CUDA_TABLE_TEXT));

struct CudaBackend : CudaTable {
  TRAINER_CUDA_BACKEND_CALLS(TRAINER_CUDA_TABLE_POINTER)
};

inline constexpr CudaTableSpec kCudaBackendSpec = {kCudaBackendEntry, "device runtime", kCudaBackendAbi,
                                                   kCudaBackendSignature, sizeof(CudaBackend)};

// The module's device runtime, fetched and checked on the first call
// (thread-safe; later calls return the same answer). nullptr when it cannot
// be had, with the reason in *why, phrased to follow "but ": "this build has
// no CUDA backend", "the CUDA module /p/libtrainer_cuda.so cannot be loaded
// (dlerror's text)".
const CudaBackend* cuda_backend(std::string* why);

}  // namespace trainer
