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

namespace trainer::cpu::attention_math {

// Query rows per block: each block's scores are one kBlock x keys sgemm.
constexpr int64_t kBlock = 64;

// Debian's OpenBLAS is the pthread build: it cannot tell that it is called
// from inside an OpenMP region and would start its own threads in every one of
// ours. While the pairs keep all cores busy, each sgemm runs on one thread.
class SerialBlas {
 public:
  explicit SerialBlas(bool on) : saved_(on ? openblas_get_num_threads() : 1) {
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

// e^x for x <= 88: within 2 ulp (1.6 measured over [-87, 0]), 0 below -87,
// NaN for NaN. It exists because libm's expf took about a third of the
// forward time and GCC vectorizes it only under -ffast-math; this body has no
// branches or calls (the underflow clamp is a bit mask: a float select counts
// as control flow under -ftrapping-math), so loops over it run on SIMD lanes.
// e^x = 2^n e^r with n = round(x / ln2) and |r| <= ln2/2 (ln2 split in two
// parts so r is exact); e^r by its degree-7 Taylor polynomial (error ~1e-9).
inline float fast_exp(float x) {
  const int32_t under = -int32_t(x < -87.f);
  x = std::bit_cast<float>((std::bit_cast<int32_t>(x) & ~under) |
                           (std::bit_cast<int32_t>(-87.f) & under));
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  return p * std::bit_cast<float>(((ni + 127) << 23) & ~under);
}

// Eight independent accumulators: one running max or sum would be a single
// dependency chain, bound by latency rather than throughput.
inline float row_max(const float* x, int64_t n) {
  float m[8];
  std::fill(m, m + 8, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], x[j + l]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return *std::max_element(m, m + 8);
}

inline double row_sum(const float* x, int64_t n) {
  double s[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) s[l] += x[j + l];
  for (; j < n; ++j) s[0] += x[j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace trainer::cpu::attention_math
