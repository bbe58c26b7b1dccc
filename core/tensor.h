// Tensor: a non-owning view {data, dtype, shape, device}. Memory belongs to an
// Arena (core/arena.h) sized once at start-up from the memory plan, so a
// Tensor can be copied freely and never frees anything.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace trainer {

enum class DType : uint8_t { F32, BF16, F16, I32, U16, U32, F64 };
enum class Device : uint8_t { CPU, CUDA };

size_t dtype_size(DType t);
const char* dtype_name(DType t);        // "F32", "BF16", ... (safetensors spelling)
const char* device_name(Device d);      // "cpu", "cuda"

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device d = Device::CPU);

  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  bool empty() const { return data == nullptr; }

  float* f32() const;        // checks dtype == F32
  int32_t* i32() const;      // checks dtype == I32

  // Same bytes, new shape with equal numel.
  Tensor view(std::initializer_list<int64_t> dims) const;
  // Rows [begin, end) along dimension 0.
  Tensor slice0(int64_t begin, int64_t end) const;
  std::string shape_str() const;  // "[4, 64, 32]"
};

}  // namespace trainer
