#include "emu/cp_async.h"

#include <cstdint>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace trainer::emu {
namespace {

std::string instruction(CpAsyncCache cache, int cp_size, int src_size) {
  return std::string("cp.async.") + (cache == CpAsyncCache::ca ? "ca" : "cg") + ".shared.global [dst], [src], " +
         std::to_string(cp_size) + ", " + std::to_string(src_size);
}

void check_aligned(const std::string& what, const char* operand, const void* p, int cp_size) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  if (addr % uintptr_t(cp_size) == 0) return;
  std::ostringstream message;
  message << what << ": " << operand << " address 0x" << std::hex << addr << std::dec << " is not aligned to cp-size "
          << cp_size << " (it is " << addr % uintptr_t(cp_size) << " bytes past a " << cp_size << "-byte boundary)";
  throw std::runtime_error(message.str());
}

void check_copy(CpAsyncCache cache, const void* dst, const void* src, int cp_size, int src_size) {
  const std::string what = instruction(cache, cp_size, src_size);
  if (cp_size != 4 && cp_size != 8 && cp_size != 16) throw std::runtime_error(what + ": cp-size must be 4, 8 or 16");
  if (cache == CpAsyncCache::cg && cp_size != 16)
    throw std::runtime_error(what + ": cp.async.cg allows only cp-size 16");
  if (src_size < 0 || src_size > cp_size)
    throw std::runtime_error(what + ": src-size must be between 0 and cp-size (" + std::to_string(cp_size) + ")");
  if (dst == nullptr) throw std::runtime_error(what + ": the destination address is null");
  if (src == nullptr && src_size > 0)
    throw std::runtime_error(what + ": the source address is null but src-size asks for bytes from it");
  check_aligned(what, "destination", dst, cp_size);
  check_aligned(what, "source", src, cp_size);
}

}  // namespace

void CpAsyncQueue::copy(CpAsyncCache cache, void* dst, const void* src, int cp_size, int src_size) {
  check_copy(cache, dst, src, cp_size, src_size);
  uncommitted_.push_back({static_cast<unsigned char*>(dst), static_cast<const unsigned char*>(src), cp_size, src_size});
}

void CpAsyncQueue::commit() {
  groups_.push_back(std::move(uncommitted_));  // possibly empty: an empty group still counts
  uncommitted_.clear();
}

void CpAsyncQueue::wait_group(int n) {
  if (n < 0) throw std::runtime_error("cp.async.wait_group " + std::to_string(n) + ": N must not be negative");
  while (groups_.size() > size_t(n)) complete_oldest_group();
}

void CpAsyncQueue::wait_all() {
  commit();
  wait_group(0);
}

size_t CpAsyncQueue::drain() {
  size_t landed = uncommitted_.size();
  for (const auto& group : groups_) landed += group.size();
  wait_all();
  return landed;
}

bool CpAsyncQueue::has_pending_write(const void* p, size_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  auto overlaps = [&](const Copy& c) {
    const auto dst = reinterpret_cast<uintptr_t>(c.dst);
    return begin < dst + uintptr_t(c.cp_size) && dst < end;
  };
  for (const Copy& c : uncommitted_)
    if (overlaps(c)) return true;
  for (const auto& group : groups_)
    for (const Copy& c : group)
      if (overlaps(c)) return true;
  return false;
}

void CpAsyncQueue::land(const Copy& copy) {
  if (copy.src_size > 0) std::memcpy(copy.dst, copy.src, size_t(copy.src_size));
  std::memset(copy.dst + copy.src_size, 0, size_t(copy.cp_size - copy.src_size));
}

void CpAsyncQueue::complete_oldest_group() {
  for (const Copy& c : groups_.front()) land(c);
  groups_.pop_front();
}

}  // namespace trainer::emu
