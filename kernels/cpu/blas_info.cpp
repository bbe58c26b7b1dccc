#include "kernels/cpu/blas_info.h"

#include <cblas.h>
#include <omp.h>

namespace trainer::cpu {

std::string blas_threading() {
  switch (openblas_get_parallel()) {
    case 0: return "serial";
    case 1: return "pthread";
    case 2: return "openmp";
    default: return "unknown";
  }
}

void set_cpu_threads(int threads) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

}  // namespace trainer::cpu
