// TRAINER_EMU_PROFILE=1: where an emulated run's time goes, kernel by
// kernel, printed to stderr at exit. Emulated kernels are 10^3-10^5 times
// slower than on a GPU, and not in the same proportions (a fiber per CUDA
// thread costs the same whatever the thread computes), so a step's time on
// the emulator says little until it is split like this.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emu/runtime_internal.h"

namespace trainer::emu::runtime {
namespace {

struct KernelTime {
  unsigned long long launches = 0;
  double seconds = 0;
};

struct Profile {
  std::mutex mutex;
  std::map<std::string, KernelTime> kernels;
};

Profile& profile() {
  static Profile* p = new Profile;  // never destroyed: printed by the atexit handler
  return *p;
}

void print_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  std::vector<std::pair<std::string, KernelTime>> rows(p.kernels.begin(), p.kernels.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (const auto& [name, t] : rows) total += t.seconds;
  std::fprintf(stderr, "emulated CUDA device: kernel time (TRAINER_EMU_PROFILE), %.2f s in all:\n", total);
  for (const auto& [name, t] : rows)
    std::fprintf(stderr, "  %9.3f s %5.1f%% %8llu launches %10.3f ms each  %s\n", t.seconds,
                 total > 0 ? 100 * t.seconds / total : 0.0, t.launches, 1e3 * t.seconds / double(t.launches),
                 name.c_str());
}

}  // namespace

bool profiling() {
  static const bool on = [] {
    const char* e = std::getenv("TRAINER_EMU_PROFILE");
    const bool set = e && *e && std::strcmp(e, "0") != 0;
    if (set) std::atexit(print_profile);
    return set;
  }();
  return on;
}

void record_launch(const std::string& kernel, double seconds) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mutex);
  KernelTime& t = p.kernels[kernel];
  ++t.launches;
  t.seconds += seconds;
}

}  // namespace trainer::emu::runtime
