// A GPU's health in words and records (core/gpu_health.h): the throttle
// reasons NVML reports by name, whether the GPU runs below its clock, the
// cause a straggler alert names, and the ranks.jsonl / TensorBoard fields.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>
#include <string>

#include "core/gpu_health.h"

namespace trainer {

// "thermal slowdown (hardware), power cap (software)"; "" when no reason
// that slows the clock is set (idle, application clocks and display are not).
std::string throttle_names(uint64_t mask);
// A slowing reason is active, or the SM clock is below 90% of its maximum.
bool gpu_throttled(const GpuHealth& g);
// "SM clock 1.21 of 1.98 GHz, thermal slowdown (hardware), 91 C, 690 of 700 W".
std::string gpu_cause(const GpuHealth& g);
// The fields of ranks.jsonl's "gpu" object (a JSON object's text).
std::string gpu_json(const GpuHealth& g);
// TensorBoard scalars of rank r: gpu/rank<r>/sm_clock_mhz and the others.
std::vector<std::pair<std::string, double>> gpu_scalars(int rank, const GpuHealth& g);

}  // namespace trainer
