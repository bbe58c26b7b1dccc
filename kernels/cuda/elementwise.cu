// Elementwise and memory ops of the CUDA backend (kernels/op_list.h): fill,
// copy, add, add_inplace, scale_inplace, convert.
//
// Map ops: one grid-stride kernel per op. A thread takes packs of 8 elements
// with 16-byte vector loads/stores when every pointer of the op is 16-byte
// aligned (8 elements are 16 bytes of BF16/F16 and 32 bytes of F32, so every
// pack stays aligned), and single elements otherwise and for the last n % 8.
// Each tensor may have its own storage type (F32/BF16/F16); arithmetic is
// fp32. All of them are bandwidth bound: add moves n*(so+sa+sb) bytes,
// add_inplace n*(2*sacc+sx), scale_inplace 2*n*s, fill n*s, convert
// n*(sd+ss); ~1 FLOP per element.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/pack.cuh"

namespace trainer::cuda {
namespace {


// Arguments arrive checked by the router (kernels/checks/elementwise.cpp):
// every tensor of a map op may have its own float storage type.

std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + dtype_name(t.dtype) + t.shape_str();
}

// ---- map ops -------------------------------------------------------------------
// Each op reads all inputs of its P elements before writing any output, so an
// output may alias an input (same elements), as ops.h allows for add.

template <typename T>
struct FillOp {
  T* p;
  float value;
  template <int P>
  __device__ void apply(int64_t i) const {
    float v[P];
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = value;
    store_pack<T, P>(p + i, v);
  }
};

template <typename TO, typename TA, typename TB>
struct AddOp {
  TO* out;
  const TA* a;
  const TB* b;
  template <int P>
  __device__ void apply(int64_t i) const {
    float x[P], y[P];
    load_pack<TA, P>(a + i, x);
    load_pack<TB, P>(b + i, y);
#pragma unroll
    for (int k = 0; k < P; ++k) x[k] += y[k];
    store_pack<TO, P>(out + i, x);
  }
};

template <typename T>
struct ScaleOp {
  T* p;
  float s;
  template <int P>
  __device__ void apply(int64_t i) const {
    float v[P];
    load_pack<T, P>(p + i, v);
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] *= s;
    store_pack<T, P>(p + i, v);
  }
};

template <typename TD, typename TS>
struct ConvertOp {
  TD* dst;
  const TS* src;
  template <int P>
  __device__ void apply(int64_t i) const {
    float v[P];
    load_pack<TS, P>(src + i, v);
    store_pack<TD, P>(dst + i, v);
  }
};

}  // namespace

void fill(Tensor t, float value) {
  const bool vec = aligned16(t.data);
  DISPATCH_FLOAT(t.dtype, T, "fill",
                 launch_map("fill_kernel", FillOp<T>{static_cast<T*>(t.data), value}, t.numel(), vec,
                            describe("t", t)));
}

// Bytes of any dtype (ids included). Partly overlapping views go through a
// temporary so the result is the source as it was, as the CPU memmove gives.
void copy(Tensor dst, Tensor src) {
  const size_t bytes = dst.nbytes();
  if (bytes == 0 || dst.data == src.data) return;
  const std::string context = describe("dst", dst) + " <- " + describe("src", src);
  const auto d = reinterpret_cast<uintptr_t>(dst.data), s = reinterpret_cast<uintptr_t>(src.data);
  const bool overlap = d < s + bytes && s < d + bytes;
  if (!overlap) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, stream()), context);
    return;
  }
  void* tmp = nullptr;
  CUDA_CHECK(cudaMallocAsync(&tmp, bytes, stream()), "copy (overlapping views) " + context);
  CUDA_CHECK(cudaMemcpyAsync(tmp, src.data, bytes, cudaMemcpyDeviceToDevice, stream()), context);
  CUDA_CHECK(cudaMemcpyAsync(dst.data, tmp, bytes, cudaMemcpyDeviceToDevice, stream()), context);
  CUDA_CHECK(cudaFreeAsync(tmp, stream()), context);
}

void add(Tensor out, Tensor a, Tensor b) {
  const bool vec = aligned16(out.data) && aligned16(a.data) && aligned16(b.data);
  const std::string context = describe("out", out) + " " + describe("a", a) + " " + describe("b", b);
  DISPATCH_FLOAT(out.dtype, TO, "add", DISPATCH_FLOAT(a.dtype, TA, "add", DISPATCH_FLOAT(b.dtype, TB, "add", {
    const AddOp<TO, TA, TB> op{static_cast<TO*>(out.data), static_cast<const TA*>(a.data),
                               static_cast<const TB*>(b.data)};
    launch_map("add_kernel", op, out.numel(), vec, context);
  })));
}

void add_inplace(Tensor acc, Tensor x) {
  const bool vec = aligned16(acc.data) && aligned16(x.data);
  const std::string context = describe("acc", acc) + " " + describe("x", x);
  DISPATCH_FLOAT(acc.dtype, TA, "add_inplace", DISPATCH_FLOAT(x.dtype, TX, "add_inplace", {
    const AddOp<TA, TA, TX> op{static_cast<TA*>(acc.data), static_cast<const TA*>(acc.data),
                               static_cast<const TX*>(x.data)};
    launch_map("add_inplace_kernel", op, acc.numel(), vec, context);
  }));
}

void scale_inplace(Tensor t, float s) {
  const bool vec = aligned16(t.data);
  DISPATCH_FLOAT(t.dtype, T, "scale_inplace",
                 launch_map("scale_inplace_kernel", ScaleOp<T>{static_cast<T*>(t.data), s}, t.numel(),
                            vec, describe("t", t)));
}

void convert(Tensor dst, Tensor src) {
  if (dst.dtype == src.dtype) return copy(dst, src);
  const bool vec = aligned16(dst.data) && aligned16(src.data);
  const std::string context = describe("dst", dst) + " <- " + describe("src", src);
  DISPATCH_FLOAT(dst.dtype, TD, "convert", DISPATCH_FLOAT(src.dtype, TS, "convert", {
    const ConvertOp<TD, TS> op{static_cast<TD*>(dst.data), static_cast<const TS*>(src.data)};
    launch_map("convert_kernel", op, dst.numel(), vec, context);
  }));
}

}  // namespace trainer::cuda
