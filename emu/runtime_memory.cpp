// Device and pinned host memory of the emulated device: host memory, each
// allocation between two guard zones. Under AddressSanitizer the zones are
// poisoned, so a kernel touching them is reported at the access; without it
// they hold a pattern that is checked after every kernel and at cudaFree, so
// a write past either end is caught at the launch that made it. New memory
// is filled with 0xFF bytes (NaN in every float format, -1 as integers)
// rather than zeros: cudaMalloc's memory is undefined, and code reading it
// unwritten should compute garbage here as it would on a GPU.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "emu/runtime_internal.h"
#include "emu/sanitizers.h"

namespace trainer::emu::runtime {
namespace {

constexpr size_t kGuardBytes = 4096;  // before and after; keeps user pointers page-aligned
// Above this the 0xFF fill is skipped: multi-GiB arenas are zeroed by their
// owner anyway, and filling them would commit every page up front.
constexpr size_t kPoisonFillMax = size_t(256) << 20;

#if defined(TRAINER_EMU_ASAN)
constexpr bool kAsan = true;
void poison(void* p, size_t bytes) { __asan_poison_memory_region(p, bytes); }
#else
constexpr bool kAsan = false;
void poison(void*, size_t) {}
#endif

unsigned char guard_byte(size_t i) { return static_cast<unsigned char>(0xA5u ^ (i * 31u)); }

const unsigned char* guard_pattern() {
  static const auto* pattern = [] {
    auto* p = new unsigned char[kGuardBytes];
    for (size_t i = 0; i < kGuardBytes; ++i) p[i] = guard_byte(i);
    return p;
  }();
  return pattern;
}

struct Allocation {
  unsigned char* base = nullptr;  // the front guard's start
  size_t bytes = 0;               // what the caller asked for
  bool device = true;
};

struct Table {
  std::mutex mutex;
  std::map<uintptr_t, Allocation> by_start;  // key: the pointer handed out
  size_t device_bytes = 0;
};

Table& table() {
  static Table* t = new Table;  // never destroyed: cudaFree may run in static destructors
  return *t;
}

std::string hex(const void* p) {
  char text[24];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

std::string describe(const Allocation& a) {
  return std::string("the ") + std::to_string(a.bytes) + "-byte " + (a.device ? "device" : "pinned host") +
         " allocation at " + hex(a.base + kGuardBytes);
}

void set_guards(const Allocation& a) {
  unsigned char* front = a.base;
  unsigned char* back = a.base + kGuardBytes + a.bytes;
  if constexpr (kAsan) {
    poison(front, kGuardBytes);
    poison(back, kGuardBytes);
  } else {
    std::memcpy(front, guard_pattern(), kGuardBytes);
    std::memcpy(back, guard_pattern(), kGuardBytes);
  }
}

// "" when both zones are intact; else where the first damage is.
std::string damaged_guard(const Allocation& a) {
  if constexpr (kAsan) return {};
  const unsigned char* front = a.base;
  const unsigned char* back = a.base + kGuardBytes + a.bytes;
  if (std::memcmp(front, guard_pattern(), kGuardBytes) != 0) {
    size_t i = 0;
    while (front[i] == guard_byte(i)) ++i;
    return std::to_string(kGuardBytes - i) + " bytes before the start of " + describe(a) + " was overwritten";
  }
  if (std::memcmp(back, guard_pattern(), kGuardBytes) != 0) {
    size_t i = 0;
    while (back[i] == guard_byte(i)) ++i;
    return "byte " + std::to_string(a.bytes + i) + " (" + std::to_string(i + 1) + " past the end) of " + describe(a) +
           " was overwritten";
  }
  return {};
}

size_t rounded_total(size_t bytes) { return (bytes + 2 * kGuardBytes + kGuardBytes - 1) / kGuardBytes * kGuardBytes; }

cudaError_t allocate(void** out, size_t bytes, bool device, const char* api) {
  if (!out) return fail(cudaErrorInvalidValue, std::string(api) + ": the pointer to store the address in is null");
  *out = nullptr;
  if (cudaError_t e = sticky_error()) return e;
  if (bytes == 0) return cudaSuccess;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (device && (bytes > device_total_bytes() || t.device_bytes + bytes > device_total_bytes()))
    return fail(cudaErrorMemoryAllocation, std::string(api) + " of " + std::to_string(bytes) + " bytes: " +
                                               std::to_string(t.device_bytes) + " of the device's " +
                                               std::to_string(device_total_bytes()) + " bytes are allocated already");
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(kGuardBytes, rounded_total(bytes)));
  if (!base)
    return fail(cudaErrorMemoryAllocation, std::string(api) + ": the host refused " + std::to_string(bytes) + " bytes");
  const Allocation a{base, bytes, device};
  set_guards(a);
  if (bytes <= kPoisonFillMax) std::memset(base + kGuardBytes, 0xFF, bytes);
  t.by_start.emplace(reinterpret_cast<uintptr_t>(base + kGuardBytes), a);
  if (device) t.device_bytes += bytes;
  *out = base + kGuardBytes;
  return cudaSuccess;
}

cudaError_t release(void* p, bool device, const char* api) {
  if (!p) return cudaSuccess;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.by_start.find(reinterpret_cast<uintptr_t>(p));
  if (it == t.by_start.end() || it->second.device != device)
    return fail(cudaErrorInvalidValue, std::string(api) + "(" + hex(p) + "): not the start of a live " +
                                           (device ? "device" : "pinned host") + " allocation");
  const Allocation a = it->second;
  t.by_start.erase(it);
  if (device) t.device_bytes -= a.bytes;
  const std::string damage = damaged_guard(a);
  sanitizers::unpoison(a.base, rounded_total(a.bytes));
  std::free(a.base);
  if (!damage.empty()) return fault(cudaErrorIllegalAddress, std::string(api) + ": " + damage);
  return sticky_error();
}

}  // namespace

bool is_allocated(const void* p) { return inside_allocation(p, 1, nullptr); }

bool inside_allocation(const void* p, size_t bytes, std::string* why) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  auto it = t.by_start.upper_bound(at);
  if (it == t.by_start.begin() || at >= std::prev(it)->first + std::max<size_t>(std::prev(it)->second.bytes, 1)) {
    if (why) *why = hex(p) + " is not device memory (no live cudaMalloc allocation holds it)";
    return false;
  }
  const auto& [start, a] = *std::prev(it);
  if (at - start + bytes <= a.bytes) return true;
  if (why)
    *why = std::to_string(bytes) + " bytes at " + hex(p) + " run " + std::to_string(at - start + bytes - a.bytes) +
           " bytes past the end of " + describe(a);
  return false;
}

cudaError_t check_guards_after(const std::string& kernel) {
  if constexpr (kAsan) return cudaSuccess;
  Table& t = table();
  std::string damage;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    for (const auto& [start, a] : t.by_start) {
      damage = damaged_guard(a);
      if (!damage.empty()) {
        set_guards(a);  // reported once
        break;
      }
    }
  }
  if (damage.empty()) return cudaSuccess;
  return fault(cudaErrorIllegalAddress, "kernel '" + kernel + "' wrote outside an allocation: " + damage);
}

}  // namespace trainer::emu::runtime

using namespace trainer::emu::runtime;

cudaError_t cudaMalloc(void** ptr, size_t bytes) { return allocate(ptr, bytes, true, "cudaMalloc"); }
cudaError_t cudaFree(void* ptr) { return release(ptr, true, "cudaFree"); }

// Stream-ordered: on a stream whose work is always done, the same as above.
cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMallocAsync: not a live stream");
  return allocate(ptr, bytes, true, "cudaMallocAsync");
}
cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaFreeAsync: not a live stream");
  return release(ptr, true, "cudaFreeAsync");
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) { return allocate(ptr, bytes, false, "cudaHostAlloc"); }
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return allocate(ptr, bytes, false, "cudaMallocHost"); }
cudaError_t cudaFreeHost(void* ptr) { return release(ptr, false, "cudaFreeHost"); }

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue, "cudaMemGetInfo: a null pointer");
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  *total_bytes = device_total_bytes();
  *free_bytes = *total_bytes - std::min(t.device_bytes, *total_bytes);
  return sticky_error();
}
