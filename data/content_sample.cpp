#include "data/content_sample.h"

#include "core/fnv1a.h"

namespace trainer {

uint64_t content_sample(const unsigned char* data, uint64_t size) {
  uint64_t h = kFnv1aStart;
  if (size <= kSampleBlocks * kSampleBlockBytes) return fnv1a(h, data, size);
  const uint64_t last = size - kSampleBlockBytes;  // where the last block starts
  for (uint64_t i = 0; i < kSampleBlocks; ++i) {
    const uint64_t at = last / (kSampleBlocks - 1) * i + (i == kSampleBlocks - 1 ? last % (kSampleBlocks - 1) : 0);
    h = fnv1a(h, data + at, kSampleBlockBytes);
  }
  return h;
}

}  // namespace trainer
