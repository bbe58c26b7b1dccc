// Copies and fills on the emulated device, done when issued (in order on
// their stream: runtime_internal.h). A pointer the copy's kind says is on the
// device must lie, with all its bytes, inside one live allocation, as the
// CUDA runtime refuses a host pointer there; a copy running past an
// allocation's end is refused here too, where a GPU might silently read the
// neighbouring allocation.
#include <cstring>
#include <string>

#include "emu/runtime_internal.h"

namespace trainer::emu::runtime {
namespace {

const char* kind_name(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault: return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

// Whether `p` must be device memory for this kind (cudaMemcpyDefault: when
// it is in an allocation, its bytes must be too).
bool on_device(cudaMemcpyKind kind, bool destination, const void* p) {
  switch (kind) {
    case cudaMemcpyHostToDevice: return destination;
    case cudaMemcpyDeviceToHost: return !destination;
    case cudaMemcpyDeviceToDevice: return true;
    case cudaMemcpyDefault: return is_allocated(p);
    default: return false;
  }
}

cudaError_t check_side(const char* api, cudaMemcpyKind kind, bool destination, const void* p, size_t bytes) {
  std::string why;
  if (!on_device(kind, destination, p) || inside_allocation(p, bytes, &why)) return cudaSuccess;
  return fail(cudaErrorInvalidValue, std::string(api) + "(" + kind_name(kind) + ", " + std::to_string(bytes) +
                                         " bytes): the " + (destination ? "destination " : "source ") + why);
}

cudaError_t copy(const char* api, void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t e = sticky_error()) return e;
  if (int(kind) < int(cudaMemcpyHostToHost) || int(kind) > int(cudaMemcpyDefault))
    return fail(cudaErrorInvalidMemcpyDirection, std::string(api) + ": kind " + std::to_string(int(kind)));
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": not a live stream");
  if (bytes == 0) return cudaSuccess;
  if (cudaError_t e = check_side(api, kind, true, dst, bytes)) return e;
  if (cudaError_t e = check_side(api, kind, false, src, bytes)) return e;
  auto lock = lock_stream(stream);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t fill(const char* api, void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (cudaError_t e = sticky_error()) return e;
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": not a live stream");
  if (bytes == 0) return cudaSuccess;
  if (std::string why; !inside_allocation(dst, bytes, &why))
    return fail(cudaErrorInvalidValue, std::string(api) + "(" + std::to_string(bytes) + " bytes): " + why);
  auto lock = lock_stream(stream);
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

}  // namespace
}  // namespace trainer::emu::runtime

using namespace trainer::emu::runtime;

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return copy("cudaMemcpy", dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return copy("cudaMemcpyAsync", dst, src, bytes, kind, stream);
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) { return fill("cudaMemset", dst, value, bytes, nullptr); }
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return fill("cudaMemsetAsync", dst, value, bytes, stream);
}
