// FNV-1a, 64 bits: a hash that is the same on every platform, compiler and
// run (std::hash is not), for names and fingerprints written to disk or
// compared across processes. Not a checksum against damage (CRC32C is:
// checkpoint/checksum.h) and not secure against forgery.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace trainer {

inline constexpr uint64_t kFnv1aStart = 0xcbf29ce484222325ull;

// Continues h over n bytes.
inline uint64_t fnv1a(uint64_t h, const void* data, uint64_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aStart) { return fnv1a(h, s.data(), s.size()); }

// 16 lower-case hex digits.
inline std::string hex64(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
  return b;
}

}  // namespace trainer
