// bf16 and fp16 on the host, for files that store them (Hugging Face
// exports and imports) and the CPU backend's convert (a GPU run's 16-bit
// tensors staged in host memory): conversion to fp32 is exact; from fp32
// rounds to nearest even, as PyTorch's .to(torch.bfloat16) does, NaN stays NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace trainer {

inline float f32_from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t bf16_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float f32_from_f16(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);  // zero and subnormals
  } else if (exp == 31) {
    const uint32_t u = sign | 0x7f800000u | (man << 13);
    std::memcpy(&f, &u, 4);
    return f;
  } else {
    const uint32_t u = sign | ((exp + 112u) << 23) | (man << 13);
    std::memcpy(&f, &u, 4);
    return f;
  }
  return sign ? -f : f;
}

// Round to nearest even, as __float2half_rn: 65520 and beyond are infinite,
// below 2^-14 the subnormals' fixed steps of 2^-24.
inline uint16_t f16_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // quiet NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // normal: rebias the exponent (127 -> 15), round 23 mantissa bits to 10
    const uint32_t r = a - (112u << 23);
    return uint16_t(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  const uint32_t e = a >> 23;
  if (e < 102) return uint16_t(sign);  // under half the smallest subnormal
  const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;  // shift 1..24
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  return uint16_t(sign | (q + (rem > half || (rem == half && (q & 1u)))));  // q + 1 may be the smallest normal
}

}  // namespace trainer
