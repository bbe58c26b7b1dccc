// The angle half of Box-Muller for parameter initialisation without libm's
// sincos, which cost more than half of the initialisation of 124M weights
// (libm reduces arbitrary arguments; here the angle is a fraction of a turn,
// whose reduction is exact). Accurate to a few double ulps, so after rounding
// to float the weights are those of std::sin / std::cos. (libm's log is
// already faster than a series written here.)
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace trainer::normal_math {

constexpr uint64_t kSignBit = uint64_t(1) << 63;

// sin and cos of 2 pi u for u in [0, 1]: u = q/4 + f with |f| <= 1/8, the
// Taylor series on |theta| = |2 pi f| <= pi/4 (to theta^17 / theta^18:
// under 1e-17), then the quarter turns q.
inline void sincos_turns(double u, double& sin_out, double& cos_out) {
  const double q = std::nearbyint(4.0 * u);
  const double th = 6.283185307179586 * (u - 0.25 * q), t2 = th * th;
  double s = 1.0 / 355687428096000.0;   // 1/17!
  double c = 1.0 / 6402373705728000.0;  // 1/18!
  const double inv_fact_s[] = {1.0 / 1307674368000.0, 1.0 / 6227020800.0, 1.0 / 39916800.0, 1.0 / 362880.0,
                               1.0 / 5040.0,           1.0 / 120.0,        1.0 / 6.0,         1.0};
  const double inv_fact_c[] = {1.0 / 20922789888000.0, 1.0 / 87178291200.0, 1.0 / 479001600.0, 1.0 / 3628800.0,
                               1.0 / 40320.0,           1.0 / 720.0,         1.0 / 24.0,        0.5,
                               1.0};
  for (int k = 0; k < 8; ++k) s = s * -t2 + inv_fact_s[k];
  for (int k = 0; k < 9; ++k) c = c * -t2 + inv_fact_c[k];
  s *= th;
  // Quarter turns q in 0..4 (4 is 0): odd q swaps sin and cos, q = 2 or 3
  // negates sin, q = 1 or 2 negates cos. Bit masks rather than a switch, so
  // a loop over many angles runs on SIMD lanes (initial_values' batches).
  const uint64_t odd = -uint64_t(q == 1.0 || q == 3.0);
  const uint64_t neg_sin = -uint64_t(q == 2.0 || q == 3.0) & kSignBit;
  const uint64_t neg_cos = -uint64_t(q == 1.0 || q == 2.0) & kSignBit;
  const uint64_t sb = std::bit_cast<uint64_t>(s), cb = std::bit_cast<uint64_t>(c);
  sin_out = std::bit_cast<double>(((cb & odd) | (sb & ~odd)) ^ neg_sin);
  cos_out = std::bit_cast<double>(((sb & odd) | (cb & ~odd)) ^ neg_cos);
}

}  // namespace trainer::normal_math
