// A vectorizable e^x for the CPU kernels' softmax, cross-entropy and
// activation loops.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace trainer::cpu {

// e^x: within 2 ulp (1.6 measured over [-87, 0]), 0 below -87, +inf above
// 88 (e^88.7 is the largest float), NaN for NaN. It exists because libm's expf took about a third of the
// forward time and GCC vectorizes it only under -ffast-math; this body has no
// branches or calls (the clamps are bit masks: a float select counts
// as control flow under -ftrapping-math), so loops over it run on SIMD lanes.
// e^x = 2^n e^r with n = round(x / ln2) and |r| <= ln2/2 (ln2 split in two
// parts so r is exact); e^r by its degree-7 Taylor polynomial (error ~1e-9).
inline float fast_exp(float x) {
  const int32_t under = -int32_t(x < -87.f);
  const int32_t over = -int32_t(x > 88.f);
  x = std::bit_cast<float>((std::bit_cast<int32_t>(x) & ~(under | over)) |
                           (std::bit_cast<int32_t>(-87.f) & under) | (std::bit_cast<int32_t>(88.f) & over));
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
  const float e = p * std::bit_cast<float>(((ni + 127) << 23) & ~under);
  return std::bit_cast<float>((std::bit_cast<int32_t>(e) & ~over) |
                              (std::bit_cast<int32_t>(std::numeric_limits<float>::infinity()) & over));
}

}  // namespace trainer::cpu
