#include "data/content_sample.h"

namespace trainer {

namespace {
// FNV-1a over a byte range, continuing from h.
uint64_t fnv1a(uint64_t h, const unsigned char* p, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
}  // namespace

uint64_t content_sample(const unsigned char* data, uint64_t size) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (size <= kSampleBlocks * kSampleBlockBytes) return fnv1a(h, data, size);
  const uint64_t last = size - kSampleBlockBytes;  // where the last block starts
  for (uint64_t i = 0; i < kSampleBlocks; ++i) {
    const uint64_t at = last / (kSampleBlocks - 1) * i + (i == kSampleBlocks - 1 ? last % (kSampleBlocks - 1) : 0);
    h = fnv1a(h, data + at, kSampleBlockBytes);
  }
  return h;
}

}  // namespace trainer
