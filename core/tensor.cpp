#include "core/tensor.h"

#include <sstream>

namespace trainer {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::U16: return 2;
    case DType::U32: return 4;
    case DType::F64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::U16: return "U16";
    case DType::U32: return "U32";
    case DType::F64: return "F64";
  }
  return "?";
}

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

Tensor::Tensor(void* p, DType t, std::initializer_list<int64_t> dims, Device d)
    : data(p), dtype(t), device(d) {
  if (dims.size() > kMaxDims) throw std::logic_error("Tensor: more than 4 dims");
  for (int64_t v : dims) shape[ndim++] = v;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

float* Tensor::f32() const {
  if (dtype != DType::F32) throw std::logic_error("Tensor::f32 on " + std::string(dtype_name(dtype)));
  return static_cast<float*>(data);
}

int32_t* Tensor::i32() const {
  if (dtype != DType::I32) throw std::logic_error("Tensor::i32 on " + std::string(dtype_name(dtype)));
  return static_cast<int32_t*>(data);
}

Tensor Tensor::view(std::initializer_list<int64_t> dims) const {
  Tensor t(data, dtype, dims, device);
  if (t.numel() != numel())
    throw std::logic_error("Tensor::view " + shape_str() + " -> " + t.shape_str());
  return t;
}

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  if (begin < 0 || end > shape[0] || begin > end)
    throw std::logic_error("Tensor::slice0 out of range on " + shape_str());
  Tensor t = *this;
  int64_t row = numel() / (shape[0] == 0 ? 1 : shape[0]);
  t.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

std::string Tensor::shape_str() const {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < ndim; ++i) s << (i ? ", " : "") << shape[i];
  s << "]";
  return s.str();
}

}  // namespace trainer
