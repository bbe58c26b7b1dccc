#include "core/device_memory.h"

#include "core/host_memory.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "core/cuda_backend.h"
#include "core/cuda_module.h"

namespace trainer {

namespace {

// Device memory is the CUDA module's (kernels/cuda/device_memory.cpp); the
// first request loads it. A build without the module refuses as before.
const CudaBackend& cuda_for(const std::string& what) {
  std::string why;
  if (const CudaBackend* b = cuda_backend(&why)) return *b;
  if (!cuda_module_built()) throw std::logic_error(what + ": CUDA memory requested, but " + why);
  throw std::runtime_error(what + ": CUDA memory requested, but " + why);
}
}  // namespace

void* device_alloc(size_t bytes, Device d, const std::string& label) {
  if (bytes == 0) return nullptr;
  if (d == Device::CPU) return host_alloc_zeroed(bytes, label);
  return cuda_for(label).alloc(bytes, label);
}

void device_free(void* p, Device d) {
  if (!p) return;
  if (d == Device::CPU) return host_free(p);
  // Device memory exists only if its allocation loaded the module.
  if (const CudaBackend* b = cuda_backend(nullptr)) b->release(p);  // no throw from destructors
}

void copy_between_devices(Tensor dst, Tensor src) {
  if (dst.dtype != src.dtype || dst.numel() != src.numel())
    throw std::invalid_argument("copy " + std::string(device_name(src.device)) + " -> " + device_name(dst.device) +
                                ": " + dtype_name(src.dtype) + src.shape_str() + " vs " + dtype_name(dst.dtype) +
                                dst.shape_str());
  if (dst.device == Device::CPU && src.device == Device::CPU) {
    std::memmove(dst.data, src.data, src.nbytes());
    return;
  }
  cuda_for("copy " + src.shape_str()).transfer(dst, src);
}

void read_to_host(Tensor src, void* host_dst) {
  Tensor dst = src;
  dst.data = host_dst;
  dst.device = Device::CPU;
  copy_between_devices(dst, src);
}

void write_from_host(Tensor dst, const void* host_src) {
  Tensor src = dst;
  src.data = const_cast<void*>(host_src);
  src.device = Device::CPU;
  copy_between_devices(dst, src);
}

}  // namespace trainer
