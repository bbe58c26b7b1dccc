// The pieces of the CPU attention kernels that attention.cpp (the whole
// sequence) and attention_positions.cpp (explicit positions, ring attention)
// share, so that both compute a row's softmax with the very same operations:
// with identity positions the two give the same bits.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

#include "kernels/cpu/row_math.h"

namespace trainer::cpu::attention_math {

using cpu::row_max;
using cpu::exp_sum_into;
using cpu::lane_sum;
using cpu::softmax_grad_row;

// Query rows per block: each block's scores are one kBlock x keys sgemm.
constexpr int64_t kBlock = 64;

// The pthread build of OpenBLAS cannot tell that it is called from inside an
// OpenMP region and would start its own threads in every one of ours: while
// the pairs keep all cores busy, each sgemm runs on one thread. The OpenMP
// build (CMakeLists.txt) already runs serially inside a parallel region, and
// there setting its threads would also set the caller's OpenMP team size.
class SerialBlas {
 public:
  explicit SerialBlas(bool on) : saved_(on && openblas_get_parallel() != 2 ? openblas_get_num_threads() : 1) {
    if (saved_ > 1) openblas_set_num_threads(1);
  }
  ~SerialBlas() {
    if (saved_ > 1) openblas_set_num_threads(saved_);
  }
  SerialBlas(const SerialBlas&) = delete;
  SerialBlas& operator=(const SerialBlas&) = delete;

 private:
  int saved_;
};

// Below about a million multiply-adds a parallel region costs more than it
// saves; with fewer pairs than cores, OpenBLAS's own threads use the machine
// better.
inline int threads_for(int64_t pairs, int64_t macs) {
  if (macs < (int64_t(1) << 20)) return 1;
  return int(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), pairs)));
}

}  // namespace trainer::cpu::attention_math
