#include "runtime/nvml.h"

#include <dlfcn.h>

#include <cstdlib>

namespace trainer {

namespace {

// NVML's C interface, as far as it is used here (nvml.h is not on every
// build machine): every call returns 0 on success; a device is a handle.
using Fn0 = int (*)();
using ErrorString = const char* (*)(int);
using HandleByIndex = int (*)(unsigned, void**);
using ClockFn = int (*)(void*, int, unsigned*);    // nvmlDeviceGet(Max)ClockInfo(device, NVML_CLOCK_SM = 1, MHz)
using TemperatureFn = int (*)(void*, int, unsigned*);  // NVML_TEMPERATURE_GPU = 0
using MilliwattFn = int (*)(void*, unsigned*);
using ReasonsFn = int (*)(void*, unsigned long long*);
using EccFn = int (*)(void*, int, int, unsigned long long*);  // UNCORRECTED = 1, VOLATILE_ECC = 0
struct Memory {
  unsigned long long total, free, used;
};
using MemoryFn = int (*)(void*, Memory*);

constexpr int kClockSm = 1, kTemperatureGpu = 0, kUncorrected = 1, kVolatile = 0;

}  // namespace

struct NvmlReader::Api {
  Fn0 init = nullptr, shutdown = nullptr;
  ErrorString error = nullptr;
  HandleByIndex handle = nullptr;
  ClockFn clock = nullptr, max_clock = nullptr;
  TemperatureFn temperature = nullptr;
  MilliwattFn power = nullptr, power_limit = nullptr;
  ReasonsFn reasons = nullptr;
  EccFn ecc = nullptr;
  MemoryFn memory = nullptr;
};

std::unique_ptr<NvmlReader> NvmlReader::open(int device, std::string* why) {
  const char* env = std::getenv("TRAINER_NVML_LIBRARY");
  const std::string path = env && *env ? env : "libnvidia-ml.so.1";
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    if (why) *why = path + " cannot be loaded (" + (e ? e : "dlopen failed") + ")";
    return nullptr;
  }
  std::unique_ptr<NvmlReader> r(new NvmlReader);
  r->lib_ = lib;
  r->library_ = path;
  r->api_ = std::make_unique<Api>();
  Api& a = *r->api_;
  auto sym = [&](const char* name) { return ::dlsym(lib, name); };
  a.init = reinterpret_cast<Fn0>(sym("nvmlInit_v2"));
  a.shutdown = reinterpret_cast<Fn0>(sym("nvmlShutdown"));
  a.error = reinterpret_cast<ErrorString>(sym("nvmlErrorString"));
  a.handle = reinterpret_cast<HandleByIndex>(sym("nvmlDeviceGetHandleByIndex_v2"));
  a.clock = reinterpret_cast<ClockFn>(sym("nvmlDeviceGetClockInfo"));
  a.max_clock = reinterpret_cast<ClockFn>(sym("nvmlDeviceGetMaxClockInfo"));
  a.temperature = reinterpret_cast<TemperatureFn>(sym("nvmlDeviceGetTemperature"));
  a.power = reinterpret_cast<MilliwattFn>(sym("nvmlDeviceGetPowerUsage"));
  a.power_limit = reinterpret_cast<MilliwattFn>(sym("nvmlDeviceGetEnforcedPowerLimit"));
  // NVML 12 renamed the throttle reasons to clock event reasons; older drivers have only the first name.
  a.reasons = reinterpret_cast<ReasonsFn>(sym("nvmlDeviceGetCurrentClocksEventReasons"));
  if (!a.reasons) a.reasons = reinterpret_cast<ReasonsFn>(sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
  a.ecc = reinterpret_cast<EccFn>(sym("nvmlDeviceGetTotalEccErrors"));
  a.memory = reinterpret_cast<MemoryFn>(sym("nvmlDeviceGetMemoryInfo"));
  if (!a.init || !a.shutdown || !a.handle || !a.clock) {
    if (why) *why = path + " lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetHandleByIndex_v2 or nvmlDeviceGetClockInfo";
    return nullptr;  // the destructor closes the library
  }
  if (const int rc = a.init(); rc != 0) {
    if (why) *why = path + ": nvmlInit_v2 failed (" + (a.error ? a.error(rc) : std::to_string(rc)) + ")";
    a.shutdown = nullptr;  // nothing to shut down
    return nullptr;
  }
  if (const int rc = a.handle(unsigned(device), &r->device_); rc != 0) {
    if (why)
      *why = path + ": no device " + std::to_string(device) + " (" + (a.error ? a.error(rc) : std::to_string(rc)) + ")";
    return nullptr;
  }
  return r;
}

NvmlReader::~NvmlReader() {
  if (api_ && api_->shutdown) api_->shutdown();
  if (lib_) ::dlclose(lib_);
}

GpuHealth NvmlReader::read() {
  GpuHealth g;
  const Api& a = *api_;
  unsigned v = 0;
  if (a.clock(device_, kClockSm, &v) != 0) return g;  // the device is gone: nothing else answers either
  g.read = true;
  g.sm_mhz = v;
  if (a.max_clock && a.max_clock(device_, kClockSm, &v) == 0) g.sm_max_mhz = v;
  if (a.temperature && a.temperature(device_, kTemperatureGpu, &v) == 0) g.temperature_c = v;
  if (a.power && a.power(device_, &v) == 0) g.power_w = v / 1e3;
  if (a.power_limit && a.power_limit(device_, &v) == 0) g.power_limit_w = v / 1e3;
  unsigned long long mask = 0;
  if (a.reasons && a.reasons(device_, &mask) == 0) g.throttle = mask;
  g.ecc_uncorrected = ecc_uncorrected();
  Memory m{};
  if (a.memory && a.memory(device_, &m) == 0) g.memory_used_gib = double(m.used) / double(1ull << 30);
  return g;
}

uint64_t NvmlReader::ecc_uncorrected() {
  unsigned long long n = 0;
  if (!api_->ecc || api_->ecc(device_, kUncorrected, kVolatile, &n) != 0) return 0;
  return n;
}

}  // namespace trainer
