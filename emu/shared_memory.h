// A block's shared memory (internal to emu/): one region per host thread,
// reused block after block, the dynamic part (extern __shared__) at its
// start and the statically declared variables after it, placed when a
// thread first asks for them. Fresh memory is poisoned rather than zeroed:
// the dynamic part when the block starts, a static variable when placed.
//
// Under ThreadSanitizer the region is mapped anew for every block and
// poisoned whole before the block's threads exist, so that TSan neither
// remembers the previous block's accesses nor sees one CUDA thread's
// poisoning as a write racing with another's first access.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace trainer::emu::detail {

class SharedArena {
 public:
  SharedArena() = default;
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // A new block: forgets the static variables and poisons the dynamic part.
  void begin_block(size_t dynamic_bytes, unsigned char poison);
  void* dynamic() const { return base_; }
  size_t dynamic_bytes() const { return dynamic_bytes_; }
  // The block's instance of the static variable `key`; throws
  // std::runtime_error (a message without the block) when it does not fit
  // or `key` was placed with another size.
  void* statics(const void* key, size_t bytes, size_t align);
  size_t used() const { return used_; }

 private:
  struct Variable {
    const void* key;
    size_t offset, bytes;
  };
  void map();

  char* base_ = nullptr;
  size_t dynamic_bytes_ = 0;
  size_t used_ = 0;
  unsigned char poison_ = 0xFF;
  std::vector<Variable> variables_;
};

}  // namespace trainer::emu::detail
