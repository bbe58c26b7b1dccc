#include "app/devices_command.h"

#include <cstdio>

#include "comm/nccl_table.h"
#include "kernels/cpu/blas_core.h"
#include "kernels/cpu/blas_info.h"
#include "core/cuda_module.h"
#include "runtime/cuda_driver.h"
#include "runtime/device_select.h"

namespace trainer {

namespace {
std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }
}  // namespace

std::string describe_devices(bool* ok) {
  *ok = true;
  std::string out;
  if (!cuda_module_built()) {
    out += "cuda module: none (this build has no CUDA backend: configure with nvcc and TRAINER_CUDA=AUTO or ON)\n";
  } else {
    const CudaDriverProbe& d = probe_cuda_driver();
    const char* unused = cuda_module_emulated() ? "; the emulated device's module needs none" : "";
    if (d.devices >= 0)
      out += "cuda driver: " + version_text(d.version) + ", " + std::to_string(d.devices) + " device(s)" + unused + "\n";
    else
      out += "cuda driver: none (" + d.why + unused + ")\n";
    std::string why;
    if (const CudaBackend* cuda = usable_cuda_module(&why)) {
      char sig[24];
      std::snprintf(sig, sizeof sig, "%016llx", static_cast<unsigned long long>(cuda->signature));
      // The device runtime's ABI and signature; the ops and NCCL tables
      // matched theirs. NCCL's version is the NCCL table's.
      out += "cuda module: " + cuda_module_path() + " (ABI " + std::to_string(cuda->abi_version) + ", signature " +
             sig + "): " + cuda->describe() + ", " + nccl_table(nullptr)->version() + "\n";
      const int n = cuda->device_count(&why);
      if (n > 0) {
        for (int i = 0; i < n; ++i) {
          const CudaDeviceInfo p = cuda->device_info(i);
          char buf[256];
          std::snprintf(buf, sizeof buf, "cuda:%d: %s, %.1f GiB, sm_%d%d, %d SMs\n", i, p.name.c_str(),
                        double(p.memory_bytes) / (1 << 30), p.major, p.minor, p.multiprocessors);
          out += buf;
        }
      } else {
        out += "cuda devices: none (" + (n == 0 ? std::string("no devices visible") : why) + ")\n";
      }
    } else {
      *ok = false;
      out += "cuda module: not loaded: " + why + "\n";
    }
  }
  out += "train.device=auto: " + select_device("auto", 0).line + "\n";
  // The CPU side too: which OpenBLAS kernels a CPU run here gets (the same
  // choice every subcommand makes at start-up, app/main.cpp), so a script
  // can run its own BLAS with the same core (scripts/bench_cpu.py).
  out += "cpu BLAS: OpenBLAS " + cpu::blas_threading() + ", " + cpu::blas_core_summary() + "\n";
  return out;
}

}  // namespace trainer
