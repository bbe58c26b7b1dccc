// ex2.approx.ftz.f32 d, a: d = 2^a (PTX ISA, "Floating Point Instructions:
// ex2"). The ISA's corner cases: ex2(-Inf) = +0, ex2(-0) = ex2(+0) = +1,
// ex2(+Inf) = +Inf, ex2(NaN) = NaN; .ftz "flushes subnormal inputs and
// results to sign-preserving zero"; the error bound is 2 ulp from the
// correctly rounded result. Computed here as exp2 in double rounded once to
// float: within 1 ulp, so inside the bound, though not bit-equal to the
// hardware's approximation.
#pragma once

#include <cmath>
#include <limits>

namespace trainer::emu {

inline float ex2_approx_ftz_f32(float a) {
  if (std::isnan(a)) return std::numeric_limits<float>::quiet_NaN();
  // .ftz on the input: 2^(subnormal) rounds to 1 anyway, so this only keeps
  // the code saying what the ISA says.
  if (std::fpclassify(a) == FP_SUBNORMAL) a = std::copysign(0.0f, a);
  const float d = float(std::exp2(double(a)));
  // 2^a is never negative, so the sign-preserving zero is +0.
  if (std::fpclassify(d) == FP_SUBNORMAL) return 0.0f;
  return d;
}

}  // namespace trainer::emu
