// Host memory for arenas and buffers: zero-filled and 64-byte aligned.
// Large blocks come straight from the kernel (anonymous mmap), whose pages
// are zero until first written: nothing is cleared up front, so start-up does
// not pay to zero gradients and optimizer state that the first step writes
// anyway, and the resident set grows only as memory is used.
#pragma once

#include <cstddef>
#include <string>

namespace trainer {

void* host_alloc_zeroed(size_t bytes, const std::string& label);
void host_free(void* p);

}  // namespace trainer
