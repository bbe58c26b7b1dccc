// bf16 and fp16 on the host, for files that store them (Hugging Face
// exports and imports): conversion to fp32 is exact; from fp32 rounds to
// nearest even, as PyTorch's .to(torch.bfloat16) does, NaN stays NaN.
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

}  // namespace trainer
