// The CUDA backend as the rest of the trainer sees it: one table of function
// pointers that libtrainer_cuda.so fills (kernels/cuda/backend_table.cpp) and
// core/cuda_module.* loads with dlopen the first time a run needs CUDA. Only
// the module links libcudart, libcublasLt and libnccl, so a CPU run never
// maps them (~150 MiB of libcublasLt alone).
//
// Both sides are built from this header by the same build, so the table may
// carry C++ types (std::string, Tensor, unique_ptr<Communicator>) and throw
// exceptions across. What the loader cannot take on trust is that the
// module on disk came from the same sources: it compares kCudaBackendAbi and
// kCudaBackendSignature, a hash of every entry's text below (the op list
// included), so a stale module is refused instead of called with the wrong
// arguments.
//
// No CUDA header here: code outside the module never needs one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace trainer {

class Communicator;
class Store;
namespace ops {
struct AdamWStep;
struct Rope;
}

// Bump by hand when something outside the two lists changes meaning (the
// signature hash covers the lists' text, not what the functions do).
inline constexpr int kCudaBackendAbi = 1;
// The module's one exported C symbol: const CudaBackend* trainer_cuda_backend().
inline constexpr const char* kCudaBackendEntry = "trainer_cuda_backend";
inline constexpr const char* kCudaModuleFile = "libtrainer_cuda.so";

struct CudaDeviceInfo {
  std::string name;
  size_t memory_bytes = 0;
  int major = 0, minor = 0;  // compute capability
  int multiprocessors = 0;
};

// Everything but the ops: (return type, name, (parameters)). Functions throw
// std::runtime_error naming the CUDA call that failed.
//   describe        "CUDA runtime 13.0, cuBLASLt 130100, NCCL 2.27.7" (no driver needed)
//   device_count    cudaGetDeviceCount: n, or -1 with the runtime's reason in *why
//   set_device      cudaSetDevice for this thread and every later CUDA call
//   alloc/release   device memory, zeroed on the compute stream (an out-of-memory
//                   error names `label` and the free bytes)
//   transfer        dst <- src between devices, same nbytes, ordered on the
//                   compute stream (core/device_memory.h says when it returns)
//   synchronize     waits for the compute stream
//   nccl_world      the NCCL world communicator (comm/nccl_communicator.h); null
//   nccl_split      in a module built without NCCL
#define TRAINER_CUDA_BACKEND_CALLS(X)                                                             \
  X(std::string, describe, ())                                                                    \
  X(int, device_count, (std::string * why))                                                       \
  X(void, set_device, (int index))                                                                \
  X(CudaDeviceInfo, device_info, (int index))                                                     \
  X(void*, alloc, (size_t bytes, const std::string& label))                                       \
  X(void, release, (void* p))                                                                     \
  X(void, transfer, (Tensor dst, Tensor src))                                                     \
  X(void, synchronize, ())                                                                        \
  X(std::unique_ptr<Communicator>, nccl_world,                                                    \
    (Store & store, int rank, int world, double timeout_s, int generation))                       \
  X(std::unique_ptr<Communicator>, nccl_split,                                                    \
    (Communicator & parent, int color, int key, std::string name, std::vector<int> members))

namespace cuda_backend_detail {
using AdamWStep = ::trainer::ops::AdamWStep;
using Rope = ::trainer::ops::Rope;

constexpr uint64_t fnv1a(const char* s) {
  uint64_t h = 14695981039346656037ull;
  for (; *s; ++s) h = (h ^ uint64_t(static_cast<unsigned char>(*s))) * 1099511628211ull;
  return h;
}

#define TRAINER_CUDA_SIGNATURE_CALL(ret, name, params) #ret " " #name #params ";"
#define TRAINER_OP(route, ret, name, params, args) #ret " " #name #params ";"
inline constexpr const char kSignatureText[] =
    TRAINER_CUDA_BACKEND_CALLS(TRAINER_CUDA_SIGNATURE_CALL)
#include "kernels/op_list.h"
    ;
#undef TRAINER_OP
#undef TRAINER_CUDA_SIGNATURE_CALL
}  // namespace cuda_backend_detail

inline constexpr uint64_t kCudaBackendSignature = cuda_backend_detail::fnv1a(cuda_backend_detail::kSignatureText);

struct CudaBackend {
  int abi_version = 0;
  uint64_t signature = 0;
  size_t table_bytes = 0;  // sizeof(CudaBackend) in the module

#define TRAINER_CUDA_POINTER(ret, name, params) ret(*name) params = nullptr;
  TRAINER_CUDA_BACKEND_CALLS(TRAINER_CUDA_POINTER)
#undef TRAINER_CUDA_POINTER

  // One pointer per op of kernels/op_list.h: the kernels/cuda functions,
  // called by the router (kernels/ops.cpp) after the shared checks.
  struct Ops {
    using AdamWStep = cuda_backend_detail::AdamWStep;
    using Rope = cuda_backend_detail::Rope;
#define TRAINER_OP(route, ret, name, params, args) ret(*name) params = nullptr;
#include "kernels/op_list.h"
#undef TRAINER_OP
  } ops;
};

using CudaBackendEntry = const CudaBackend* (*)();

}  // namespace trainer
