#include "observe/gpu_report.h"

#include <cstdio>

namespace trainer {

namespace {

// NVML's nvmlClocksEventReason* bits that lower the clock against the
// work's wish (GpuIdle 0x1, ApplicationsClocksSetting 0x2 and
// DisplayClockSetting 0x100 are settings or idleness, not a fault).
struct Reason {
  uint64_t bit;
  const char* name;
};
constexpr Reason kSlowing[] = {
    {0x40, "thermal slowdown (hardware)"}, {0x20, "thermal slowdown (software)"},
    {0x80, "power brake (hardware)"},      {0x08, "hardware slowdown"},
    {0x04, "power cap (software)"},        {0x10, "sync boost"},
};

}  // namespace

std::string throttle_names(uint64_t mask) {
  std::string s;
  for (const Reason& r : kSlowing)
    if (mask & r.bit) s += (s.empty() ? "" : ", ") + std::string(r.name);
  return s;
}

bool gpu_throttled(const GpuHealth& g) {
  return g.read && (!throttle_names(g.throttle).empty() || (g.sm_max_mhz > 0 && g.sm_mhz < 0.9 * g.sm_max_mhz));
}

std::string gpu_cause(const GpuHealth& g) {
  char b[256];
  std::snprintf(b, sizeof b, "SM clock %.2f of %.2f GHz", g.sm_mhz / 1e3, g.sm_max_mhz / 1e3);
  std::string s = b;
  const std::string why = throttle_names(g.throttle);
  if (!why.empty()) s += ", " + why;
  std::snprintf(b, sizeof b, ", %.0f C, %.0f of %.0f W", g.temperature_c, g.power_w, g.power_limit_w);
  return s + b;
}

std::string gpu_json(const GpuHealth& g) {
  char b[400];
  std::snprintf(b, sizeof b,
                "{\"sm_clock_mhz\": %.0f, \"sm_clock_max_mhz\": %.0f, \"temperature_c\": %.0f, \"power_w\": %.1f, "
                "\"power_limit_w\": %.1f, \"memory_used_gib\": %.3f, \"throttle_reasons\": \"0x%llx\", "
                "\"throttled\": %s, \"ecc_uncorrected\": %llu}",
                g.sm_mhz, g.sm_max_mhz, g.temperature_c, g.power_w, g.power_limit_w, g.memory_used_gib,
                (unsigned long long)g.throttle, gpu_throttled(g) ? "true" : "false",
                (unsigned long long)g.ecc_uncorrected);
  return b;
}

std::vector<std::pair<std::string, double>> gpu_scalars(int rank, const GpuHealth& g) {
  const std::string p = "gpu/rank" + std::to_string(rank) + "/";
  return {{p + "sm_clock_mhz", g.sm_mhz},
          {p + "temperature_c", g.temperature_c},
          {p + "power_w", g.power_w},
          {p + "memory_used_gib", g.memory_used_gib},
          {p + "throttled", gpu_throttled(g) ? 1.0 : 0.0},
          {p + "ecc_uncorrected", double(g.ecc_uncorrected)}};
}

}  // namespace trainer
