// Arena: one allocation per memory category (params, grads, optimizer state,
// activations, workspace), sized up front from the memory plan. Tensors are
// carved from it in order and never freed individually, so the bytes the plan
// predicts are exactly the bytes the run holds.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace trainer {

// Every carve is rounded to this many bytes, in the plan and in the arena alike.
constexpr size_t kArenaAlign = 64;
inline size_t arena_round(size_t bytes) { return (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

// A named tensor shape; the same list feeds the memory plan and the allocation.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::F32;
  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
};

size_t arena_bytes(const std::vector<TensorSpec>& specs);

class Arena {
 public:
  Arena() = default;
  Arena(std::string label, size_t bytes, Device device);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&& o) noexcept;
  Arena& operator=(Arena&& o) noexcept;

  Tensor alloc(const TensorSpec& spec);
  std::vector<Tensor> alloc_all(const std::vector<TensorSpec>& specs);
  // The whole arena as one flat F32 tensor (optimizer and norm loops use it).
  Tensor flat_f32() const;
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  Device device() const { return device_; }

 private:
  std::string label_;
  char* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  Device device_ = Device::CPU;
};

}  // namespace trainer
