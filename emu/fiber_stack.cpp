#include "emu/fiber_stack.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu/sanitizers.h"

namespace trainer::emu {
namespace {

// Enough for two 1024-thread blocks' worth of fibers on every host thread of
// a large machine; past it, stacks go back to the kernel.
constexpr size_t kMaxCached = 8192;

struct StackCache {
  std::mutex mutex;
  std::vector<FiberStack> stacks;
};

StackCache& cache() {
  static StackCache* c = new StackCache;  // never destroyed: fibers may outlive static destruction order
  return *c;
}

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

FiberStack map_stack(size_t usable_bytes) {
  const size_t page = page_bytes();
  const size_t usable = (usable_bytes + page - 1) / page * page;
  FiberStack s;
  s.mapping_bytes = usable + page;
  s.mapping = ::mmap(nullptr, s.mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
  if (s.mapping == MAP_FAILED)
    throw std::runtime_error("emu: cannot map a fiber stack of " + std::to_string(s.mapping_bytes) +
                             " bytes: " + std::strerror(errno));
  // Stacks grow down: the guard is the lowest page.
  if (::mprotect(s.mapping, page, PROT_NONE) != 0) {
    const int err = errno;
    ::munmap(s.mapping, s.mapping_bytes);
    throw std::runtime_error(std::string("emu: cannot protect a fiber stack's guard page: ") + std::strerror(err));
  }
  s.bottom = static_cast<char*>(s.mapping) + page;
  s.bytes = usable;
  return s;
}

}  // namespace

FiberStack acquire_fiber_stack(size_t usable_bytes) {
  const size_t page = page_bytes();
  const size_t usable = (usable_bytes + page - 1) / page * page;
  if (!sanitizers::kTsan) {
    StackCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (size_t i = c.stacks.size(); i-- > 0;) {
      if (c.stacks[i].bytes != usable) continue;
      FiberStack s = c.stacks[i];
      c.stacks[i] = c.stacks.back();
      c.stacks.pop_back();
      return s;
    }
  }
  return map_stack(usable);
}

void release_fiber_stack(FiberStack stack) {
  if (!stack.mapping) return;
  if (!sanitizers::kTsan) {
    StackCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.stacks.size() < kMaxCached) {
      c.stacks.push_back(stack);
      return;
    }
  }
  ::munmap(stack.mapping, stack.mapping_bytes);
}

}  // namespace trainer::emu
