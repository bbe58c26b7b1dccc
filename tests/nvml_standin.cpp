// A stand-in for NVML (libnvidia-ml.so.1) that scripts a device, so that
// runtime/nvml.h and the rank monitor's use of it run without a GPU
// (TRAINER_NVML_LIBRARY=<this library>). TRAINER_NVML_STANDIN_SCRIPT names a
// file of lines
//   DEVICE FROM_READ SM_MHZ MAX_MHZ TEMP_C POWER_W LIMIT_W REASONS ECC MEM_MIB
// (REASONS in hex or decimal; `#` starts a comment): device DEVICE reports
// these values from its FROM_READ-th sample on, a sample being one call of
// nvmlDeviceGetClockInfo; until its first line a device is healthy at
// 1980 MHz. A device number no line names is still a device.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct State {
  long from = 0;
  unsigned sm = 1980, max = 1980, temp = 40, power_w = 300, limit_w = 700;
  unsigned long long reasons = 0, ecc = 0, mem_mib = 1024;
};

struct Device {
  int index = 0;
  long reads = -1;  // samples taken
};

std::mutex mu;
std::map<int, std::vector<State>> script;
Device devices[64];

void load() {
  const char* path = std::getenv("TRAINER_NVML_STANDIN_SCRIPT");
  if (!path) return;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream f(line);
    int dev = 0;
    State s;
    std::string reasons;
    if (!(f >> dev >> s.from >> s.sm >> s.max >> s.temp >> s.power_w >> s.limit_w >> reasons >> s.ecc >> s.mem_mib)) continue;
    s.reasons = std::stoull(reasons, nullptr, 0);
    script[dev].push_back(s);
  }
}

State now(const Device* d) {
  State s;
  for (const State& x : script[d->index])
    if (x.from <= d->reads) s = x;
  return s;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  std::lock_guard<std::mutex> g(mu);
  script.clear();
  load();
  return 0;
}
int nvmlShutdown() { return 0; }
const char* nvmlErrorString(int rc) { return rc == 0 ? "Success" : "stand-in error"; }

int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  if (index >= 64) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  devices[index].index = int(index);
  *device = &devices[index];
  return 0;
}

int nvmlDeviceGetClockInfo(void* device, int, unsigned* mhz) {
  std::lock_guard<std::mutex> g(mu);
  auto* d = static_cast<Device*>(device);
  ++d->reads;
  *mhz = now(d).sm;
  return 0;
}
int nvmlDeviceGetMaxClockInfo(void* device, int, unsigned* mhz) {
  std::lock_guard<std::mutex> g(mu);
  *mhz = now(static_cast<Device*>(device)).max;
  return 0;
}
int nvmlDeviceGetTemperature(void* device, int, unsigned* c) {
  std::lock_guard<std::mutex> g(mu);
  *c = now(static_cast<Device*>(device)).temp;
  return 0;
}
int nvmlDeviceGetPowerUsage(void* device, unsigned* mw) {
  std::lock_guard<std::mutex> g(mu);
  *mw = now(static_cast<Device*>(device)).power_w * 1000;
  return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(void* device, unsigned* mw) {
  std::lock_guard<std::mutex> g(mu);
  *mw = now(static_cast<Device*>(device)).limit_w * 1000;
  return 0;
}
int nvmlDeviceGetCurrentClocksEventReasons(void* device, unsigned long long* reasons) {
  std::lock_guard<std::mutex> g(mu);
  *reasons = now(static_cast<Device*>(device)).reasons;
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* device, int, int, unsigned long long* count) {
  std::lock_guard<std::mutex> g(mu);
  *count = now(static_cast<Device*>(device)).ecc;
  return 0;
}
int nvmlDeviceGetMemoryInfo(void* device, unsigned long long* memory) {
  std::lock_guard<std::mutex> g(mu);
  const unsigned long long used = now(static_cast<Device*>(device)).mem_mib << 20;
  memory[0] = 80ull << 30;  // total, free, used
  memory[1] = memory[0] - used;
  memory[2] = used;
  return 0;
}

}  // extern "C"
