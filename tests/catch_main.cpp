// Entry point of unit_tests. The CUDA module is built next to `trainer`, not
// next to this binary, so in-process loads (tests/test_cuda_module.cpp, a
// run with train.device=auto on a GPU machine) are pointed at it, unless the
// caller chose another one. Child `trainer` processes inherit the variable;
// the test of the lookup next to the binary removes it.
// OpenBLAS's core is chosen and checked as `trainer` does (app/main.cpp,
// kernels/cpu/blas_core.h), so in-process runs and child `trainer`
// processes multiply with the same kernels.
#define CATCH_CONFIG_RUNNER
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <cstdlib>

#include "kernels/cpu/blas_core.h"

int main(int argc, char* argv[]) {
  if (trainer::cpu::choose_blas_core()) ::execv("/proc/self/exe", argv);  // returns only on failure
  if (trainer::cpu::reject_unverified_blas_core()) ::execv("/proc/self/exe", argv);
  // Where this build put it; binaries copied elsewhere without it (a flat
  // directory with the module beside them) use the lookup next to themselves.
  if (*TRAINER_CUDA_MODULE_FILE && ::access(TRAINER_CUDA_MODULE_FILE, R_OK) == 0)
    ::setenv("TRAINER_CUDA_MODULE", TRAINER_CUDA_MODULE_FILE, 0);
  return Catch::Session().run(argc, argv);
}
