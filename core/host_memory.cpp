#include "core/host_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace trainer {
namespace {

constexpr size_t kAlign = 64;
// Below this, malloc's own pools are cheaper than a mapping per block.
constexpr size_t kMapThreshold = size_t(1) << 20;

// Mapped blocks and their lengths: munmap needs the length, and host_free
// must tell a mapping from a malloc'd block.
struct Mappings {
  std::mutex mu;
  std::unordered_map<void*, size_t> len;
};
Mappings& mappings() {
  static Mappings* m = new Mappings;  // never destroyed: frees may run during exit
  return *m;
}

[[noreturn]] void out_of_memory(const std::string& label, size_t bytes, const char* how) {
  throw std::runtime_error("out of host memory: " + label + " needs " + std::to_string(bytes) + " bytes (" + how +
                           ": " + std::strerror(errno) + ")");
}

}  // namespace

void* host_alloc_zeroed(size_t bytes, const std::string& label) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded < kMapThreshold) {
    void* p = std::aligned_alloc(kAlign, rounded);
    if (!p) out_of_memory(label, bytes, "aligned_alloc");
    std::memset(p, 0, rounded);
    return p;
  }
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) out_of_memory(label, bytes, "mmap");
  // Transparent huge pages where the system allows them on request
  // ("madvise" mode): a 2 MiB page per fault and per TLB entry for the
  // arenas that the optimizer and the matmuls sweep every step. Advice only:
  // a refusal changes nothing.
  madvise(p, rounded, MADV_HUGEPAGE);
  std::lock_guard<std::mutex> lock(mappings().mu);
  mappings().len[p] = rounded;
  return p;
}

void host_free(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mappings().mu);
    auto it = mappings().len.find(p);
    if (it != mappings().len.end()) {
      munmap(p, it->second);
      mappings().len.erase(it);
      return;
    }
  }
  std::free(p);
}

}  // namespace trainer
