// The one emulated device: an H100 SXM's properties (sm_90, 132 SMs, its
// shared-memory and thread limits, which the kernels' launch checks and
// opt-ins read) with the host's available memory as its own, and a name
// that says plainly it is the CPU: the start-up line and `trainer devices`
// print it.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "emu/runtime_internal.h"
#include "emu/simt.h"

namespace trainer::emu::runtime {
namespace {

constexpr const char* kDeviceName = "Emulated CUDA device (H100 SXM properties) on the CPU";
constexpr int kMultiprocessors = 132;
constexpr size_t kSharedPerBlock = 48 * 1024;             // without the opt-in
constexpr size_t kSharedPerBlockOptin = kMaxSharedBytesPerBlock;  // 227 KiB
constexpr size_t kSharedPerMultiprocessor = 228 * 1024;
constexpr int kRegisters = 64 * 1024;  // per block and per SM
constexpr int kL2Bytes = 50 * 1024 * 1024;

size_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string key;
    size_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return size_t(::sysconf(_SC_AVPHYS_PAGES)) * size_t(::sysconf(_SC_PAGESIZE));
}

// CUDA_VISIBLE_DEVICES hides the device unless its list starts with 0 (the
// runtime stops at the first entry it cannot use).
int visible_devices() {
  const char* list = std::getenv("CUDA_VISIBLE_DEVICES");
  if (!list) return 1;
  return std::strncmp(list, "0", 1) == 0 && (list[1] == '\0' || list[1] == ',') ? 1 : 0;
}

cudaError_t check_device(const char* api, int device) {
  if (visible_devices() == 0) return fail(cudaErrorNoDevice, std::string(api) + ": CUDA_VISIBLE_DEVICES hides the device");
  if (device != 0)
    return fail(cudaErrorInvalidDevice, std::string(api) + ": device " + std::to_string(device) +
                                            " (the emulated device is the only one: 0)");
  return cudaSuccess;
}

void fill_limits(cudaDeviceProp& p) {
  p.sharedMemPerBlock = kSharedPerBlock;
  p.sharedMemPerBlockOptin = kSharedPerBlockOptin;
  p.sharedMemPerMultiprocessor = kSharedPerMultiprocessor;
  p.reservedSharedMemPerBlock = 1024;
  p.regsPerBlock = kRegisters;
  p.regsPerMultiprocessor = kRegisters;
  p.warpSize = 32;
  p.maxThreadsPerBlock = 1024;
  p.maxThreadsDim[0] = 1024;
  p.maxThreadsDim[1] = 1024;
  p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 2147483647;
  p.maxGridSize[1] = 65535;
  p.maxGridSize[2] = 65535;
  p.maxThreadsPerMultiProcessor = 2048;
  p.maxBlocksPerMultiProcessor = 32;
  p.totalConstMem = 64 * 1024;
}

cudaDeviceProp properties() {
  cudaDeviceProp p;
  std::memset(&p, 0, sizeof p);
  std::snprintf(p.name, sizeof p.name, "%s", kDeviceName);
  p.totalGlobalMem = device_total_bytes();
  p.major = 9;
  p.minor = 0;
  p.multiProcessorCount = kMultiprocessors;
  fill_limits(p);
  p.l2CacheSize = kL2Bytes;
  p.memoryBusWidth = 5120;
  p.concurrentKernels = 1;
  p.unifiedAddressing = 1;
  p.canMapHostMemory = 1;
  p.asyncEngineCount = 2;
  p.memoryPoolsSupported = 1;
  p.textureAlignment = 512;
  p.memPitch = 2147483647;
  return p;
}

bool attribute(cudaDeviceAttr attr, const cudaDeviceProp& p, int* value) {
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; return true;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; return true;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; return true;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; return true;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; return true;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; return true;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; return true;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(p.sharedMemPerBlock); return true;
    case cudaDevAttrTotalConstantMemory: *value = int(p.totalConstMem); return true;
    case cudaDevAttrWarpSize: *value = p.warpSize; return true;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; return true;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; return true;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; return true;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; return true;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; return true;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; return true;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = int(p.sharedMemPerMultiprocessor); return true;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = p.regsPerMultiprocessor; return true;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(p.sharedMemPerBlockOptin); return true;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = p.maxBlocksPerMultiProcessor; return true;
    case cudaDevAttrReservedSharedMemoryPerBlock: *value = int(p.reservedSharedMemPerBlock); return true;
    case cudaDevAttrUnifiedAddressing: *value = p.unifiedAddressing; return true;
    case cudaDevAttrConcurrentKernels: *value = p.concurrentKernels; return true;
    case cudaDevAttrMemoryPoolsSupported: *value = p.memoryPoolsSupported; return true;
    default: return false;
  }
}

}  // namespace

size_t device_total_bytes() {
  static const size_t total = host_available_bytes();
  return total;
}

}  // namespace trainer::emu::runtime

using namespace trainer::emu::runtime;

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: a null pointer");
  *count = visible_devices();
  if (*count == 0) return fail(cudaErrorNoDevice, "CUDA_VISIBLE_DEVICES hides the emulated device");
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice: a null pointer");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return check_device("cudaSetDevice", device); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: a null pointer");
  if (cudaError_t e = check_device("cudaGetDeviceProperties", device)) return e;
  *prop = properties();
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: a null pointer");
  if (cudaError_t e = check_device("cudaDeviceGetAttribute", device)) return e;
  if (!attribute(attr, properties(), value))
    return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(int(attr)) +
                                           " is not emulated (emu/runtime_device.cpp lists those that are)");
  return cudaSuccess;
}

// The emulator stands in for the driver too: both report the toolkit the
// module was built with.
cudaError_t cudaRuntimeGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: a null pointer");
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (!version) return fail(cudaErrorInvalidValue, "cudaDriverGetVersion: a null pointer");
  *version = CUDART_VERSION;
  return cudaSuccess;
}
