#include "emu/shared_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "emu/sanitizers.h"
#include "emu/simt.h"

namespace trainer::emu::detail {
namespace {

// Static variables may ask for alignments up to a page; the region is
// page-aligned, so offsets aligned to them are too.
constexpr size_t kMaxAlign = 4096;

std::string bytes_text(size_t bytes) { return std::to_string(bytes) + " bytes"; }

std::string address_text(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

}  // namespace

SharedArena::~SharedArena() {
  if (base_) ::munmap(base_, kMaxSharedBytesPerBlock);
}

void SharedArena::map() {
  if (base_) ::munmap(base_, kMaxSharedBytesPerBlock);
  void* p = ::mmap(nullptr, kMaxSharedBytesPerBlock, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    base_ = nullptr;
    throw std::runtime_error(std::string("emu: cannot map a block's shared memory: ") + std::strerror(errno));
  }
  base_ = static_cast<char*>(p);
}

void SharedArena::begin_block(size_t dynamic_bytes, unsigned char poison) {
  if (dynamic_bytes > kMaxSharedBytesPerBlock)
    throw std::runtime_error("emu: " + bytes_text(dynamic_bytes) + " of dynamic shared memory exceed the " +
                             bytes_text(kMaxSharedBytesPerBlock) + " (227 KiB) a block may have");
  if (!base_ || sanitizers::kTsan) map();
  dynamic_bytes_ = dynamic_bytes;
  used_ = (dynamic_bytes + 15) / 16 * 16;
  poison_ = poison;
  variables_.clear();
  std::memset(base_, poison, sanitizers::kTsan ? kMaxSharedBytesPerBlock : dynamic_bytes);
}

void* SharedArena::statics(const void* key, size_t bytes, size_t align) {
  for (const Variable& v : variables_) {
    if (v.key != key) continue;
    if (v.bytes != bytes)
      throw std::runtime_error("the __shared__ variable with key " + address_text(key) +
                               " asked for with " + bytes_text(bytes) + " after " + bytes_text(v.bytes));
    return base_ + v.offset;
  }
  if (align == 0) align = 1;
  if ((align & (align - 1)) != 0 || align > kMaxAlign)
    throw std::runtime_error("__shared__ variable alignment " + std::to_string(align) +
                             " is not a power of two up to 4096");
  const size_t offset = (used_ + align - 1) / align * align;
  if (offset > kMaxSharedBytesPerBlock || bytes > kMaxSharedBytesPerBlock - offset)
    throw std::runtime_error("shared memory of " + bytes_text(offset + bytes) + " (" + bytes_text(dynamic_bytes_) +
                             " dynamic, the rest static, this variable " + bytes_text(bytes) + ") exceeds the " +
                             bytes_text(kMaxSharedBytesPerBlock) + " (227 KiB) a block may have");
  variables_.push_back({key, offset, bytes});
  used_ = offset + bytes;
  if (!sanitizers::kTsan) std::memset(base_ + offset, poison_, bytes);  // under TSan: poisoned at the start
  return base_ + offset;
}

}  // namespace trainer::emu::detail
