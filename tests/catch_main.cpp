// Entry point of unit_tests. The CUDA module is built next to `trainer`, not
// next to this binary, so in-process loads (tests/test_cuda_module.cpp, a
// run with train.device=auto on a GPU machine) are pointed at it, unless the
// caller chose another one. Child `trainer` processes inherit the variable;
// the test of the lookup next to the binary removes it.
#define CATCH_CONFIG_RUNNER
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

int main(int argc, char* argv[]) {
#ifdef TRAINER_CUDA_MODULE_FILE
  // Where this build put it; binaries copied elsewhere without it (a flat
  // directory with the module beside them) use the lookup next to themselves.
  if (::access(TRAINER_CUDA_MODULE_FILE, R_OK) == 0) ::setenv("TRAINER_CUDA_MODULE", TRAINER_CUDA_MODULE_FILE, 0);
#endif
  return Catch::Session().run(argc, argv);
}
