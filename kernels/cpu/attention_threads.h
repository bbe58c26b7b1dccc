// How the CPU attention kernels (attention.cpp, attention_positions.cpp)
// spread their work: independent pairs (a (batch, head) pair, or a kv head
// with its query heads), one OpenMP thread each, every thread with its own
// score scratch and OpenBLAS kept serial inside the parallel region.
#pragma once

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace trainer::cpu::attention_threads {

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

// body(p, scratch) for every pair p < pairs, `macs` multiply-adds in all:
// on threads_for's threads, each with `scratch_floats` floats of its own.
// Pairs write disjoint outputs, so the results do not depend on the threads.
template <typename Body>
void for_each_pair(int64_t pairs, int64_t macs, int64_t scratch_floats, Body body) {
  const int threads = threads_for(pairs, macs);
  std::vector<float> S(size_t(threads * scratch_floats));
  SerialBlas serial(threads > 1);
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t p = 0; p < pairs; ++p) body(p, S.data() + omp_get_thread_num() * scratch_floats);
}

}  // namespace trainer::cpu::attention_threads
