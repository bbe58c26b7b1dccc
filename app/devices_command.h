// `trainer devices`: what this machine and build offer for CUDA, in a few
// lines: the driver (asked directly, runtime/cuda_driver.h), the CUDA module
// (loaded, even without a driver, to show that it can be: every symbol it
// needs from this binary resolves), the devices the CUDA runtime sees, and
// what train.device=auto picks. Exit code 1 when the build has a module that
// does not load, so scripts can check a GPU install in one call.
#pragma once

#include <string>

namespace trainer {

// The report, and *ok = false when the build's module cannot be loaded.
std::string describe_devices(bool* ok);

}  // namespace trainer
