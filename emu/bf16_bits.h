// The two 16-bit float formats the tensor-core instructions read (.bf16 and
// IEEE binary16, PTX's .f16), converted to and from float on raw bits. The
// emulator works on register bits, never on CUDA's __nv_bfloat16/__half, so
// these are written out here: decoding is exact (both formats are subsets of
// binary32), encoding rounds to nearest, ties to even (cvt.rn's rounding).
#pragma once

#include <bit>
#include <cstdint>

namespace trainer::emu {

// Which 16-bit format a .b16 element holds (PTX's .atype/.btype).
enum class Type16 { bf16, f16 };

// bf16 is the upper half of a binary32, so decoding is a shift.
inline float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }

inline uint16_t float_to_bf16_rn(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  // A NaN whose payload sits only in the dropped low half would round to an
  // Inf pattern: keep it a (quiet) NaN with the same sign.
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the kept LSB rounds half-way cases to the even result;
  // the carry may ripple into the exponent, which is the correct next value
  // (up to Inf past the largest finite bf16).
  const uint32_t keep_lsb = (u >> 16) & 1u;
  return uint16_t((u + 0x7fffu + keep_lsb) >> 16);
}

inline float f16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f)  // Inf or NaN; a NaN's payload (and quiet bit) moves up unchanged
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = float(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

namespace detail {
// (significand >> shift) rounded to nearest, ties to even; shift >= 1.
inline uint32_t shift_right_rne(uint32_t significand, int shift) {
  if (shift > 31) return 0;
  const uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}
}  // namespace detail

inline uint16_t float_to_f16_rn(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const int exponent = int((u >> 23) & 0xffu);
  const uint32_t mantissa = u & 0x7fffffu;
  if (exponent == 0xff)  // Inf stays Inf; a NaN stays a quiet NaN
    return uint16_t(sign | 0x7c00u | (mantissa ? 0x200u | (mantissa >> 13) : 0u));
  // The value is significand * 2^(exponent - 150) (a float subnormal has no
  // hidden bit and the exponent of 1). Below 2^-14 the half is subnormal: the
  // value in units of its smallest step, 2^-24, is significand >> (126 -
  // exponent), rounded. Above, 13 of the 24 significand bits are dropped.
  const uint32_t significand = exponent ? (mantissa | 0x800000u) : mantissa;
  const int unbiased = (exponent ? exponent : 1) - 127;
  if (unbiased >= 16) return uint16_t(sign | 0x7c00u);  // >= 65536: Inf
  if (unbiased < -14) return uint16_t(sign | detail::shift_right_rne(significand, 126 - (exponent ? exponent : 1)));
  // Normal range: 10 fraction bits, rounded; an overflow past 65504 lands on
  // 0x7c00, the Inf pattern, as round-to-nearest requires.
  const uint32_t rounded = detail::shift_right_rne(significand, 13);  // 1.f in 11 bits (or 2.0 after carry)
  const uint32_t biased = uint32_t(unbiased + 15);
  return uint16_t(sign | ((biased << 10) + (rounded - 0x400u)));
}

inline float to_float(Type16 type, uint16_t bits) {
  return type == Type16::bf16 ? bf16_to_float(bits) : f16_to_float(bits);
}
inline uint16_t from_float_rn(Type16 type, float value) {
  return type == Type16::bf16 ? float_to_bf16_rn(value) : float_to_f16_rn(value);
}

}  // namespace trainer::emu
