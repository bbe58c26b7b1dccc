// A cheap fingerprint of a file's bytes for the token-scan cache
// (data/scan_cache.h): its size, mtime and inode say when a file was
// replaced, but not when it was edited in place and its mtime put back
// (touch -r, rsync -t, tar). The fingerprint hashes up to kSampleBlocks
// blocks of kSampleBlockBytes at fixed places (the first and the last
// included, the rest spread evenly), so checking it costs at most 1 MiB of
// reading however large the file. A file up to that size is hashed whole
// and any edit changes it; in a larger one an edit outside the sampled
// blocks goes unseen (the same trade as the stamp itself: the cache trusts
// what it cannot cheaply check; delete FILE.scan to force a scan).
#pragma once

#include <cstdint>

namespace trainer {

inline constexpr uint64_t kSampleBlocks = 16, kSampleBlockBytes = 64 * 1024;

uint64_t content_sample(const unsigned char* data, uint64_t size);

}  // namespace trainer
