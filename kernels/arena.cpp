#include "kernels/arena.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

namespace trainer {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

size_t arena_bytes(const std::vector<TensorSpec>& specs) {
  size_t total = 0;
  for (const auto& s : specs) total += arena_round(s.bytes());
  return total;
}

Arena::Arena(std::string label, size_t bytes, Device device)
    : label_(std::move(label)), capacity_(bytes), device_(device) {
  if (device != Device::CPU)
    throw std::logic_error("Arena " + label_ + ": only host arenas exist in this build");
  if (bytes == 0) return;
  base_ = static_cast<char*>(std::aligned_alloc(kArenaAlign, arena_round(bytes)));
  if (!base_)
    throw std::runtime_error("out of host memory: arena '" + label_ + "' needs " +
                             std::to_string(bytes) + " bytes");
  // Zeroed so gradients start at 0 and unused tail rows are defined.
  std::memset(base_, 0, arena_round(bytes));
}

Arena::~Arena() { std::free(base_); }

Arena::Arena(Arena&& o) noexcept { *this = std::move(o); }

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    std::free(base_);
    label_ = std::move(o.label_);
    base_ = std::exchange(o.base_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    device_ = o.device_;
  }
  return *this;
}

Tensor Arena::alloc(const TensorSpec& spec) {
  size_t need = arena_round(spec.bytes());
  if (used_ + need > capacity_)
    throw std::logic_error("arena '" + label_ + "' overflow at '" + spec.name +
                           "': the memory plan and the allocation disagree");
  Tensor t;
  t.data = base_ + used_;
  t.dtype = spec.dtype;
  t.device = device_;
  t.ndim = int(spec.shape.size());
  if (t.ndim > kMaxDims) throw std::logic_error("tensor '" + spec.name + "' has more than 4 dims");
  for (int i = 0; i < t.ndim; ++i) t.shape[i] = spec.shape[i];
  used_ += need;
  return t;
}

std::vector<Tensor> Arena::alloc_all(const std::vector<TensorSpec>& specs) {
  std::vector<Tensor> out;
  out.reserve(specs.size());
  for (const auto& s : specs) out.push_back(alloc(s));
  return out;
}

Tensor Arena::flat_f32() const {
  return Tensor(base_, DType::F32, {int64_t(capacity_ / 4)}, device_);
}

}  // namespace trainer
