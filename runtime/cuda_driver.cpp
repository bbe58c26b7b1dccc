#include "runtime/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace trainer {

namespace {

// The driver API's own types (cuda.h), declared here so that nothing outside
// the CUDA module needs a CUDA header: CUresult is an int, 0 is success.
using CuResult = int;
using CuInit = CuResult (*)(unsigned int);
using CuInt = CuResult (*)(int*);
using CuErrorText = CuResult (*)(CuResult, const char**);

std::string error_text(void* lib, CuResult r) {
  auto name = reinterpret_cast<CuErrorText>(::dlsym(lib, "cuGetErrorName"));
  auto text = reinterpret_cast<CuErrorText>(::dlsym(lib, "cuGetErrorString"));
  const char* n = nullptr;
  const char* t = nullptr;
  if (name) name(r, &n);
  if (text) text(r, &t);
  std::string s = n ? n : "CUresult " + std::to_string(r);
  if (t) s += std::string(" (") + t + ")";
  return s;
}

CudaDriverProbe probe() {
  CudaDriverProbe p;
  // Kept open: the CUDA runtime opens the same library when the module
  // loads, and a driver is not safe to unload once initialised.
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    p.why = std::string("no CUDA driver: ") + (e ? e : "libcuda.so.1 cannot be loaded");
    return p;
  }
  auto init = reinterpret_cast<CuInit>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CuInt>(::dlsym(lib, "cuDeviceGetCount"));
  auto version = reinterpret_cast<CuInt>(::dlsym(lib, "cuDriverGetVersion"));
  if (!init || !count) {
    p.why = "the CUDA driver libcuda.so.1 has no cuInit or cuDeviceGetCount";
    return p;
  }
  if (version) version(&p.version);
  if (const CuResult r = init(0); r != 0) {
    p.why = "the CUDA driver's cuInit failed: " + error_text(lib, r);
    return p;
  }
  int n = 0;
  if (const CuResult r = count(&n); r != 0) {
    p.why = "the CUDA driver's cuDeviceGetCount failed: " + error_text(lib, r);
    return p;
  }
  p.devices = n;
  if (n == 0) p.why = "no devices visible";
  return p;
}

}  // namespace

const CudaDriverProbe& probe_cuda_driver() {
  static CudaDriverProbe p;
  static std::once_flag once;
  std::call_once(once, [] { p = probe(); });
  return p;
}

}  // namespace trainer
