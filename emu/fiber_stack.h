// A fiber's machine stack: anonymous memory with an inaccessible guard page
// below it, so that a kernel overflowing its stack faults at once instead of
// overwriting the neighbouring fiber's frames.
//
// Blocks come and go by the thousand per launch, each with up to 1024
// fibers: stacks are kept in a process-wide cache instead of being mapped
// and unmapped every block. Under ThreadSanitizer they are not: a fresh
// mapping is how TSan forgets the accesses of the stack's previous owner,
// which would otherwise look like races with the next one.
#pragma once

#include <cstddef>

namespace trainer::emu {

struct FiberStack {
  void* mapping = nullptr;  // guard page included
  size_t mapping_bytes = 0;
  void* bottom = nullptr;  // lowest usable address
  size_t bytes = 0;        // usable bytes, from bottom up
};

// At least `usable_bytes` (rounded up to whole pages) of stack.
FiberStack acquire_fiber_stack(size_t usable_bytes);
void release_fiber_stack(FiberStack stack);

}  // namespace trainer::emu
