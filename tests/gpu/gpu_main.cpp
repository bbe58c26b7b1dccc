// Entry point of gpu_tests: the CUDA ops against their CPU twins. Without a
// usable CUDA device it prints why and exits 77, which ctest reports as
// skipped (SKIP_RETURN_CODE), so a CPU-only machine stays green while saying
// that nothing was checked.
#define CATCH_CONFIG_RUNNER
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/gpu/gpu_test_util.h"

namespace {
constexpr int kSkip = 77;

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}
}  // namespace

int main(int argc, char* argv[]) {
  // The ops load the CUDA module as the trainer does; the build puts it next
  // to `trainer`, not next to this binary. Binaries copied elsewhere without
  // it (GPU_CHECK_BIN_DIR's flat directory, the module beside them) use the
  // lookup next to themselves.
  if (::access(TRAINER_CUDA_MODULE_FILE, R_OK) == 0) ::setenv("TRAINER_CUDA_MODULE", TRAINER_CUDA_MODULE_FILE, 0);
  // One line at a time, also into a pipe or file: a family killed at its
  // time limit (scripts/gpu-check.sh) keeps every [gpu] line printed so far.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Listing tests and help need no device.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "-?" || a == "--help" || a == "-l" || a == "-t" ||
        a.rfind("--list", 0) == 0)
      return Catch::Session().run(argc, argv);
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    const std::string reason = e != cudaSuccess
                                   ? std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e)
                                   : std::string("cudaGetDeviceCount found 0 devices");
    // On a machine that is meant to have a GPU a skip would hide a broken
    // driver; GPU_TESTS_REQUIRE_DEVICE=1 turns it into a failure.
    if (env_flag("GPU_TESTS_REQUIRE_DEVICE")) {
      std::printf("gpu_tests: FAILED: no CUDA device (%s) and GPU_TESTS_REQUIRE_DEVICE is set\n",
                  reason.c_str());
      return 1;
    }
    std::printf("gpu_tests: SKIPPED: no CUDA device (%s)\n", reason.c_str());
    return kSkip;
  }

  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, dev);
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  if (const char* s = std::getenv("GPU_TESTS_SEED"))
    trainer::gputest::g_seed_base = std::strtoull(s, nullptr, 10);
  std::printf(
      "gpu_tests: device %d of %d: %s, %d SMs, sm_%d%d, %.1f GiB, driver %d, runtime %d, seed "
      "%llu%s\n",
      dev, count, p.name, p.multiProcessorCount, p.major, p.minor,
      double(p.totalGlobalMem) / double(1ull << 30), driver, runtime,
      (unsigned long long)trainer::gputest::g_seed_base,
      trainer::gputest::emulator_shapes() ? ", the emulator's shapes (GPU_TESTS_SHAPES=gpu: the GPU's)" : "");
  std::fflush(stdout);

  const int failed = Catch::Session().run(argc, argv);
  // Catch returns the number of failed test cases; 77 of them must not read
  // as "skipped".
  return failed == kSkip ? 1 : failed;
}
