// Which OpenBLAS build the process got: its threading decides whether the
// GEMMs share the OpenMP threads of the other CPU kernels (CMakeLists.txt).
#pragma once

#include <string>

namespace trainer::cpu {

// "openmp", "pthread" or "serial" (OpenBLAS's own answer).
std::string blas_threading();
// Sets the threads of both the OpenMP pool and OpenBLAS.
void set_cpu_threads(int threads);

}  // namespace trainer::cpu
