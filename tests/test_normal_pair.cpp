// The libm-free sin and cos of parameter initialisation (model/normal_pair.h)
// against std::sin and std::cos: the weights are floats, so what matters is
// that the rounded Box-Muller values agree.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <random>

#include "model/normal_pair.h"

using namespace trainer;

TEST_CASE("normal_pair: libm-free sincos gives libm's values", "[init]") {
  std::mt19937_64 gen(7);
  double max_trig = 0;
  int64_t float_diffs = 0;
  const int64_t n = 1 << 20;
  for (int64_t i = 0; i < n; ++i) {
    // The generator's grids: u1 in (0, 1] and u2 in [0, 1), 53 bits; also
    // the eighth turns, where the quadrant changes.
    double u1 = (double(gen() >> 11) + 1.0) * 0x1.0p-53;
    double u2 = double(gen() >> 11) * 0x1.0p-53;
    if (i < 8) u2 = 0.125 * double(i);
    const double l = std::log(u1);
    double s, c;
    normal_math::sincos_turns(u2, s, c);
    const double s_ref = std::sin(2 * M_PI * u2), c_ref = std::cos(2 * M_PI * u2);
    max_trig = std::max({max_trig, std::abs(s - s_ref), std::abs(c - c_ref)});
    const double r = std::sqrt(-2.0 * l);
    float_diffs += float(r * c) != float(r * c_ref);
    float_diffs += float(r * s) != float(r * s_ref);
  }
  std::printf("normal_pair: max abs error of sin/cos %.3g, %lld of %lld floats differ\n", max_trig,
              (long long)float_diffs, (long long)(2 * n));
  CHECK(max_trig < 1e-15);
  // Two doubles a few ulps apart round to different floats only when they
  // straddle a rounding boundary: about one draw in 10^7.
  CHECK(float_diffs <= 2 * n / 100000);
}
