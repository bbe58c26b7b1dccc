#include "core/arena.h"

#include "core/device_memory.h"

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
  // Zeroed so gradients start at 0 and unused tail rows are defined.
  base_ = static_cast<char*>(device_alloc(arena_round(bytes), device, "arena '" + label_ + "'"));
}

Arena::~Arena() { device_free(base_, device_); }

Arena::Arena(Arena&& o) noexcept { *this = std::move(o); }

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    device_free(base_, device_);
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
