// The accelerators the plan (app/plan_command.h) estimates time on:
// one table of data-sheet numbers per GPU, and the `hardware:` section of
// the configuration, which picks an entry, overrides its numbers or
// describes a GPU the table does not know. The MFU figure of a real run
// (observe/step_time.h peak_tflops) reads its peaks from the same table.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace trainer {

struct Hardware {
  std::string name;           // "a100-80gb"
  double memory_gib = 0;      // device memory
  double bf16_tflops = 0;     // dense (no sparsity) bf16/fp16 tensor-core peak
  double hbm_gb_s = 0;        // memory bandwidth, GB/s
  // GPU-to-GPU inside a node, GB/s in both directions together as data
  // sheets give it (NVLink; PCIe for cards without): a ring sends at half.
  double nvlink_gb_s = 0;
  double network_gbit_s = 0;  // per GPU, per direction, across nodes (the node's NICs / its GPUs)
  int gpus_per_node = 8;
  // Share of the peak that the model's matmuls reach: MFU of well-tuned
  // dense training is commonly 0.4-0.55, so 0.5 unless configured.
  double matmul_efficiency = 0.5;
  const char* source = "";    // where the numbers come from
  // Latency, microseconds: a collective costs collective_latency_us plus
  // one step latency per message of its ring (all-reduce 2(p-1), all-gather,
  // reduce-scatter, all-to-all and broadcast p-1, a send 1). The defaults
  // are NCCL's own tuning model (src/graph/tuning.cc, ring with the Simple
  // protocol: base 8.4 us; per step 3.4 us on NVLink, 9.6 us on the network).
  double collective_latency_us = 8.4;
  double nvlink_latency_us = 3.4;
  double network_latency_us = 9.6;
};

// The built-in entries, in the order the error message lists them.
const std::vector<Hardware>& known_gpus();
// "h100, h200, a100-80gb, ..." (names accepted, case-insensitive).
std::string known_gpu_names();
// Entry by name (case-insensitive; "a100" means a100-80gb, "h100" the SXM);
// nullptr when unknown.
const Hardware* find_gpu(const std::string& name);
// The entry whose name a device line ("NVIDIA A100-SXM4-40GB") contains;
// nullptr when none (the CPU).
const Hardware* gpu_of_device_line(const std::string& line);

// The hardware of `c.hardware` with `gpu_override` (a --gpu flag; "" none)
// taking the place of hardware.gpu: a known entry with the section's
// non-zero numbers over it, or a custom GPU whose every number the section
// gives (nvlink_gb_s not with gpus_per_node 1: no group is inside a node).
// Throws ConfigError naming the known GPUs for an unknown name without the
// numbers, and naming the missing keys.
Hardware resolve_hardware(const Config& c, const std::string& gpu_override = "");

}  // namespace trainer
