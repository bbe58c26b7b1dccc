#include "checkpoint/checksum.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace trainer {

namespace {

// Reflected form of 0x1EDC6F41: bits are processed least significant first,
// which is what makes the byte-at-a-time table lookup below work.
constexpr uint32_t kPolyReflected = 0x82F63B78u;

// Slicing-by-8: table k maps a byte to its CRC contribution when it is
// followed by k more zero bytes, so eight input bytes are folded with eight
// independent lookups instead of eight dependent ones (about 5x faster than
// one table, which matters for multi-gigabyte checkpoint files).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k)
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  }
};

constexpr Tables kTables;

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = kTables.t;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    // Assemble little-endian words byte by byte: alignment-free and
    // endian-independent; the compiler turns it into a single load on x86.
    const uint32_t lo = c ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
    const uint32_t hi = uint32_t(p[4]) | uint32_t(p[5]) << 8 | uint32_t(p[6]) << 16 | uint32_t(p[7]) << 24;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

uint32_t crc32c_file(const std::string& path, uint64_t* bytes) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  constexpr size_t kBlock = 1 << 20;
  std::unique_ptr<char[]> buf(new char[kBlock]);
  uint32_t crc = 0;
  uint64_t total = 0;
  size_t got;
  while ((got = std::fread(buf.get(), 1, kBlock, f)) > 0) {
    crc = crc32c(buf.get(), got, crc);
    total += got;
  }
  const bool failed = std::ferror(f);
  const int err = errno;
  std::fclose(f);
  if (failed) throw std::runtime_error(path + ": read failed: " + std::strerror(err));
  if (bytes) *bytes = total;
  return crc;
}

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

}  // namespace trainer
