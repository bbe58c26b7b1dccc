#include "planner/hardware.h"

#include <algorithm>
#include <cctype>

namespace trainer {

namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

// Vendor data-sheet numbers, dense (the sparsity figures are twice these).
// NVLink / PCIe as the sheets give it: both directions together. Network
// per GPU: the reference system's NICs divided by its GPUs. Memory in GiB
// as nominal capacity (the CUDA context takes a little of it).
const std::vector<Hardware>& known_gpus() {
  static const std::vector<Hardware> table = {
      // NVIDIA H100 Tensor Core GPU data sheet (SXM5): BF16 1,979 TFLOPS with
      // sparsity, 80 GB HBM3 3.35 TB/s, NVLink 900 GB/s; DGX H100: 8 x 400 Gb/s ConnectX-7.
      {"h100", 80, 989, 3350, 900, 400, 8, 0.5, "NVIDIA H100 SXM5 data sheet; DGX H100 network"},
      // NVIDIA H200 data sheet (SXM): BF16 1,979 TFLOPS with sparsity, 141 GB
      // HBM3e 4.8 TB/s, NVLink 900 GB/s; DGX H200: 8 x 400 Gb/s.
      {"h200", 141, 989, 4800, 900, 400, 8, 0.5, "NVIDIA H200 SXM data sheet; DGX H200 network"},
      // NVIDIA A100 data sheet (SXM4 80GB): BF16 312 TFLOPS, HBM2e 2,039 GB/s,
      // NVLink 600 GB/s; DGX A100: 8 x 200 Gb/s HDR InfiniBand.
      {"a100-80gb", 80, 312, 2039, 600, 200, 8, 0.5, "NVIDIA A100 SXM4 80GB data sheet; DGX A100 network"},
      // Same sheet, SXM4 40GB: HBM2 1,555 GB/s.
      {"a100-40gb", 40, 312, 1555, 600, 200, 8, 0.5, "NVIDIA A100 SXM4 40GB data sheet; DGX A100 network"},
      // A10G (AWS G5; NVIDIA publishes no sheet for this SKU): 24 GB GDDR6
      // 600 GB/s, the 70 TFLOPS bf16 AWS quotes, PCIe Gen4 x16 (64 GB/s);
      // g5.48xlarge: 100 Gbit/s for 8 GPUs.
      {"a10g", 24, 70, 600, 64, 12.5, 8, 0.5, "AWS G5 (A10G) figures; PCIe Gen4 x16; g5.48xlarge network"},
      // NVIDIA L40S data sheet: BF16 362.05 TFLOPS (733 with sparsity), 48 GB
      // GDDR6 864 GB/s, PCIe Gen4 x16 (64 GB/s); AWS g6e.48xlarge: 400 Gbit/s for 8 GPUs.
      {"l40s", 48, 362, 864, 64, 50, 8, 0.5, "NVIDIA L40S data sheet; PCIe Gen4 x16; g6e.48xlarge network"},
      // NVIDIA L4 data sheet: BF16 121 TFLOPS (242 with sparsity), 24 GB
      // GDDR6 300 GB/s, PCIe Gen4 x16; AWS g6.48xlarge: 100 Gbit/s for 8 GPUs.
      {"l4", 24, 121, 300, 64, 12.5, 8, 0.5, "NVIDIA L4 data sheet; PCIe Gen4 x16; g6.48xlarge network"},
      // NVIDIA HGX/DGX B200: BF16 36 PFLOPS with sparsity for 8 GPUs (2.25
      // dense per GPU), 1,440 GB HBM3e at 64 TB/s for 8 GPUs, NVLink 5 1.8 TB/s
      // per GPU; DGX B200: 8 x 400 Gb/s ConnectX-7.
      {"b200", 180, 2250, 8000, 1800, 400, 8, 0.5, "NVIDIA DGX B200 data sheet"},
      // The export versions: the H100 and A100 compute, NVLink cut to 400 GB/s.
      {"h800", 80, 989, 3350, 400, 400, 8, 0.5, "H100 SXM5 compute, NVLink 400 GB/s"},
      {"a800", 80, 312, 2039, 400, 200, 8, 0.5, "A100 SXM4 80GB compute, NVLink 400 GB/s"},
  };
  return table;
}

std::string known_gpu_names() {
  std::string s;
  for (const Hardware& h : known_gpus()) s += (s.empty() ? "" : ", ") + h.name;
  return s;
}

const Hardware* find_gpu(const std::string& name) {
  std::string n = lower(name);
  if (n == "a100") n = "a100-80gb";
  if (n == "h100-sxm" || n == "h100-80gb") n = "h100";
  for (const Hardware& h : known_gpus())
    if (h.name == n) return &h;
  return nullptr;
}

const Hardware* gpu_of_device_line(const std::string& line) {
  const std::string l = lower(line);
  // Longer names first: "l40s" contains "l4", an A100's line says 40GB or 80GB.
  for (const char* name : {"h200", "h100", "h800", "b200", "a800", "a10g", "l40s", "l4"})
    if (l.find(name) != std::string::npos) return find_gpu(name);
  if (l.find("a100") != std::string::npos) return find_gpu(l.find("40gb") != std::string::npos ? "a100-40gb" : "a100-80gb");
  return nullptr;
}

Hardware resolve_hardware(const Config& c, const std::string& gpu_override) {
  const HardwareConfig& h = c.hardware;
  const std::string name = gpu_override.empty() ? h.gpu : gpu_override;
  const std::string where = gpu_override.empty() ? "hardware.gpu=" + name : "--gpu " + name;
  Hardware out;
  if (const Hardware* known = find_gpu(name)) {
    out = *known;
  } else {
    std::vector<std::string> missing;
    if (h.memory_gib <= 0) missing.push_back("hardware.memory_gib");
    if (h.bf16_tflops <= 0) missing.push_back("hardware.bf16_tflops");
    // One GPU per node has no link inside a node to price (a calibration
    // of one rank per node measures none).
    if (h.nvlink_gb_s <= 0 && h.gpus_per_node != 1) missing.push_back("hardware.nvlink_gb_s");
    if (h.network_gbit_s <= 0) missing.push_back("hardware.network_gbit_s");
    if (!missing.empty()) {
      std::string keys;
      for (const std::string& k : missing) keys += (keys.empty() ? "" : ", ") + k;
      throw ConfigError(c.source + ": " + (name.empty() ? std::string("no GPU named (hardware.gpu or --gpu)") : where + " is not a GPU the table knows") +
                        "; known GPUs: " + known_gpu_names() + "; or describe it with " + keys +
                        (h.calibration.empty() ? std::string()
                                               : " (hardware.calibration " + h.calibration +
                                                     " has none of them: `trainer calibrate` did not measure them)"));
    }
    out.name = name.empty() ? "custom" : name;
    out.source = "the hardware section of the configuration";
  }
  if (h.memory_gib > 0) out.memory_gib = h.memory_gib;
  if (h.bf16_tflops > 0) out.bf16_tflops = h.bf16_tflops;
  if (h.hbm_gb_s > 0) out.hbm_gb_s = h.hbm_gb_s;
  if (h.nvlink_gb_s > 0) out.nvlink_gb_s = h.nvlink_gb_s;
  if (h.network_gbit_s > 0) out.network_gbit_s = h.network_gbit_s;
  if (h.gpus_per_node > 0) out.gpus_per_node = h.gpus_per_node;
  if (h.matmul_efficiency > 0) out.matmul_efficiency = h.matmul_efficiency;
  if (h.collective_latency_us > 0) out.collective_latency_us = h.collective_latency_us;
  if (h.nvlink_latency_us > 0) out.nvlink_latency_us = h.nvlink_latency_us;
  if (h.network_latency_us > 0) out.network_latency_us = h.network_latency_us;
  return out;
}

}  // namespace trainer
