// Kernel launches on the emulated device and the one function attribute the
// kernels set. CUDA checks a launch's configuration before it runs and
// reports a failure through cudaGetLastError() without touching the device;
// a fault while the kernel runs corrupts the context, a sticky error.
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>

#include "emu/kernel_names.h"
#include "emu/runtime_internal.h"
#include "emu/runtime_launch.h"
#include "emu/block.h"
#include "emu/simt.h"

namespace trainer::emu::runtime {
namespace {

constexpr size_t kDefaultDynamicShared = 48 * 1024;

struct FunctionAttributes {
  std::mutex mutex;
  std::unordered_map<const void*, size_t> max_dynamic_shared;
};

FunctionAttributes& attributes() {
  static FunctionAttributes a;
  return a;
}

size_t max_dynamic_shared(const void* kernel) {
  FunctionAttributes& a = attributes();
  std::lock_guard<std::mutex> lock(a.mutex);
  auto it = a.max_dynamic_shared.find(kernel);
  return it == a.max_dynamic_shared.end() ? kDefaultDynamicShared : it->second;
}

// The executor's "(x,y,z)", for the runtime's own dim3.
std::string dims(dim3 d) { return detail::dim_text(Dim3{d.x, d.y, d.z}); }

// What cudaErrorInvalidConfiguration means: "" when the sizes are legal.
std::string bad_configuration(dim3 grid, dim3 block) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "grid " + dims(grid) + " has a zero extent";
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return "grid " + dims(grid) + " exceeds the device's (2147483647,65535,65535)";
  if (block.x == 0 || block.y == 0 || block.z == 0) return "block " + dims(block) + " has a zero extent";
  if (block.x > 1024 || block.y > 1024 || block.z > 64) return "block " + dims(block) + " exceeds (1024,1024,64)";
  if (static_cast<unsigned long long>(block.x) * block.y * block.z > 1024)
    return "block " + dims(block) + " has more than the 1024 threads a block may have";
  return {};
}

cudaError_t check_launch(const std::string& name, const void* kernel, dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream) {
  const std::string at = "launch of kernel '" + name + "': ";
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, at + "not a live stream");
  if (std::string why = bad_configuration(grid, block); !why.empty())
    return fail(cudaErrorInvalidConfiguration, at + why);
  if (const size_t limit = max_dynamic_shared(kernel); smem > limit)
    return fail(cudaErrorInvalidValue,
                at + std::to_string(smem) + " bytes of dynamic shared memory, above the " + std::to_string(limit) +
                    " the kernel may have (above 48 KiB, up to 227 KiB, it needs cudaFuncSetAttribute("
                    "cudaFuncAttributeMaxDynamicSharedMemorySize) first)");
  return cudaSuccess;
}

Dim3 to_dim3(dim3 d) { return Dim3{d.x, d.y, d.z}; }

}  // namespace
}  // namespace trainer::emu::runtime

namespace trainer::emu {

void launch_kernel(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const std::function<void()>& body) {
  using namespace runtime;
  if (sticky_error() != cudaSuccess) return;  // cudaGetLastError() reports it
  LaunchOptions options;
  options.name = kernel_name(kernel);
  if (check_launch(options.name, kernel, grid, block, smem, stream) != cudaSuccess) return;
  auto lock = lock_stream(stream);
  const auto start = std::chrono::steady_clock::now();
  try {
    launch(to_dim3(grid), to_dim3(block), smem, body, options);
  } catch (const std::exception& e) {
    fault(cudaErrorLaunchFailure, e.what());
    return;
  } catch (...) {
    fault(cudaErrorLaunchFailure, "kernel '" + options.name + "' threw something that is not a std::exception");
    return;
  }
  if (profiling())
    record_launch(options.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  check_guards_after(options.name);
}

}  // namespace trainer::emu

using namespace trainer::emu::runtime;

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (!func) return fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: a null function");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;  // hints (carveout, ...)
  if (value < 0 || size_t(value) > trainer::emu::kMaxSharedBytesPerBlock)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize, " +
                                           std::to_string(value) + ") for kernel '" + trainer::emu::kernel_name(func) +
                                           "': the device allows at most " +
                                           std::to_string(trainer::emu::kMaxSharedBytesPerBlock));
  FunctionAttributes& a = attributes();
  std::lock_guard<std::mutex> lock(a.mutex);
  a.max_dynamic_shared[func] = size_t(value);
  return cudaSuccess;
}
