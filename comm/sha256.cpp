#include "comm/sha256.h"

#include <cstdio>
#include <vector>

namespace trainer {

namespace {

// The constants are the first 32 bits of the fractional parts of the cube
// roots (K) and square roots (H0) of the first primes (FIPS 180-4 4.2.2,
// 5.3.3). They are computed here with exact integer roots rather than
// typed in: floor(frac(root(p)) * 2^32) is the low 32 bits of
// floor(root(p * 2^(32 n))) for the n-th root.
using u128 = unsigned __int128;

uint64_t integer_root(u128 x, int n) {  // largest r with r^n <= x
  uint64_t lo = 0, hi = uint64_t(1) << 40;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    u128 p = 1;
    for (int i = 0; i < n; ++i) p *= mid;
    if (p <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct Constants {
  uint32_t k[64];
  uint32_t h0[8];
  Constants() {
    std::vector<uint64_t> primes;
    for (uint64_t c = 2; primes.size() < 64; ++c) {
      bool prime = true;
      for (uint64_t p : primes) prime = prime && c % p != 0;
      if (prime) primes.push_back(c);
    }
    for (int i = 0; i < 64; ++i) k[i] = uint32_t(integer_root(u128(primes[size_t(i)]) << 96, 3));
    for (int i = 0; i < 8; ++i) h0[i] = uint32_t(integer_root(u128(primes[size_t(i)]) << 64, 2));
  }
};

const Constants& constants() {
  static const Constants c;
  return c;
}

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block into the state (FIPS 180-4 6.2.2).
void compress(uint32_t h[8], const uint8_t* block) {
  const uint32_t* K = constants().k;
  uint32_t w[64];
  for (int t = 0; t < 16; ++t)
    w[t] = uint32_t(block[4 * t]) << 24 | uint32_t(block[4 * t + 1]) << 16 | uint32_t(block[4 * t + 2]) << 8 |
           uint32_t(block[4 * t + 3]);
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[t] + w[t];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

}  // namespace

Sha256Digest sha256(std::string_view data) {
  uint32_t h[8];
  for (int i = 0; i < 8; ++i) h[i] = constants().h0[i];
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t full = data.size() / 64;
  for (size_t b = 0; b < full; ++b) compress(h, p + 64 * b);
  // Padding (5.1.1): a 1 bit, zeros, the message length in bits as a
  // big-endian 64-bit number, to a multiple of 64 bytes.
  uint8_t tail[128] = {0};
  const size_t rest = data.size() - 64 * full;
  for (size_t i = 0; i < rest; ++i) tail[i] = p[64 * full + i];
  tail[rest] = 0x80;
  const size_t tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
  const uint64_t bits = uint64_t(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - size_t(i)] = uint8_t(bits >> (8 * i));
  compress(h, tail);
  if (tail_len == 128) compress(h, tail + 64);
  Sha256Digest out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j) out[size_t(4 * i + j)] = uint8_t(h[i] >> (24 - 8 * j));
  return out;
}

Sha256Digest hmac_sha256(std::string_view key, std::string_view message) {
  constexpr size_t kBlock = 64;
  std::string k(key);
  if (k.size() > kBlock) {
    const Sha256Digest d = sha256(k);
    k.assign(reinterpret_cast<const char*>(d.data()), d.size());
  }
  k.resize(kBlock, '\0');
  std::string inner(kBlock, '\0'), outer(kBlock, '\0');
  for (size_t i = 0; i < kBlock; ++i) {
    inner[i] = char(uint8_t(k[i]) ^ 0x36);
    outer[i] = char(uint8_t(k[i]) ^ 0x5c);
  }
  inner.append(message);
  const Sha256Digest ih = sha256(inner);
  outer.append(reinterpret_cast<const char*>(ih.data()), ih.size());
  return sha256(outer);
}

std::string to_hex(const Sha256Digest& d) {
  std::string s;
  char b[3];
  for (uint8_t x : d) {
    std::snprintf(b, sizeof b, "%02x", x);
    s += b;
  }
  return s;
}

}  // namespace trainer
