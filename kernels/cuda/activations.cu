// GELU (tanh approximation) and SwiGLU of the CUDA backend (see kernels/op_list.h),
// the same formulas as kernels/cpu/activations.cpp, evaluated in fp32.
//
// One grid-stride kernel per op. A thread takes packs of 8 elements with
// 16-byte vector loads/stores when every pointer of the op is 16-byte aligned,
// single elements otherwise and for the last n % 8. All tensors of one call
// share one storage type (F32, BF16 or F16). Every input of an element is read
// before its outputs are written, so outputs may alias inputs elementwise
// (gelu_backward's dinp = dout, swiglu_backward's dgate/dup over dout).
// Bandwidth bound; per element, s = bytes of the storage type:
//   gelu_forward    2s bytes, ~15 FLOPs + 1 exp
//   gelu_backward   3s bytes, ~20 FLOPs + 1 exp
//   swiglu_forward  3s bytes, ~5 FLOPs + 1 exp
//   swiglu_backward 5s bytes, ~10 FLOPs + 1 exp
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/map.cuh"
#include "kernels/cuda/pack.cuh"

namespace trainer::cuda {
namespace {

using checks::fail;

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// ---- argument checks ---------------------------------------------------------
// Shapes arrive checked by the router (kernels/checks/activations.cpp); the
// kernels are templated on one storage type per call.

void like(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  if (t.dtype != ref.dtype)
    fail(op, std::string(name) + " is " + dtype_name(t.dtype) + " but " + ref_name + " is " +
                 dtype_name(ref.dtype) + ": one storage type per call");
}



// P == 1: one element. P == kMapPack: 16-byte vector accesses on a 16-byte
// aligned address (the host checks before choosing the vector path).




// ---- the functions (as the CPU twin writes them) -------------------------------

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// 0.5 x (1 + tanh(u)) written as x * sigmoid(2u): the same function without
// the cancellation of 1 + tanh(u) for negative x.
__device__ __forceinline__ float gelu(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x * sigmoid(2.f * u);
}

// d/dx [x s(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
__device__ __forceinline__ float gelu_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float du = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
  const float s = sigmoid(2.f * u);
  return s + 2.f * x * s * (1.f - s) * du;
}

template <typename T>
struct GeluForward {
  T* out;
  const T* inp;
  template <int P>
  __device__ void apply(int64_t i) const {
    float x[P];
    load_pack<T, P>(inp + i, x);
#pragma unroll
    for (int k = 0; k < P; ++k) x[k] = gelu(x[k]);
    store_pack<T, P>(out + i, x);
  }
};

template <typename T>
struct GeluBackward {
  T* dinp;
  const T* dout;
  const T* inp;
  template <int P>
  __device__ void apply(int64_t i) const {
    float g[P], x[P];
    load_pack<T, P>(dout + i, g);
    load_pack<T, P>(inp + i, x);
#pragma unroll
    for (int k = 0; k < P; ++k) g[k] *= gelu_grad(x[k]);
    store_pack<T, P>(dinp + i, g);
  }
};

template <typename T>
struct SwigluForward {
  T* out;
  const T* gate;
  const T* up;
  template <int P>
  __device__ void apply(int64_t i) const {
    float a[P], b[P];
    load_pack<T, P>(gate + i, a);
    load_pack<T, P>(up + i, b);
#pragma unroll
    for (int k = 0; k < P; ++k) a[k] = a[k] * sigmoid(a[k]) * b[k];
    store_pack<T, P>(out + i, a);
  }
};

// silu'(a) = s (1 + a (1 - s)).
template <typename T>
struct SwigluBackward {
  T* dgate;
  T* dup;
  const T* dout;
  const T* gate;
  const T* up;
  template <int P>
  __device__ void apply(int64_t i) const {
    float a[P], b[P], g[P], da[P], db[P];
    load_pack<T, P>(gate + i, a);
    load_pack<T, P>(up + i, b);
    load_pack<T, P>(dout + i, g);
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float s = sigmoid(a[k]);
      da[k] = g[k] * b[k] * s * (1.f + a[k] * (1.f - s));
      db[k] = g[k] * a[k] * s;
    }
    store_pack<T, P>(dgate + i, da);
    store_pack<T, P>(dup + i, db);
  }
};

std::string describe(const Tensor& t) { return std::string(dtype_name(t.dtype)) + t.shape_str(); }

}  // namespace

void gelu_forward(Tensor out, Tensor inp) {
  const char* op = "gelu_forward";
  like(op, "out", out, "inp", inp);
  const bool vec = aligned16(out.data) && aligned16(inp.data);
  DISPATCH_FLOAT(inp.dtype, T, op, {
    const GeluForward<T> f{static_cast<T*>(out.data), static_cast<const T*>(inp.data)};
    launch_map("gelu_forward_kernel", f, inp.numel(), vec, "inp " + describe(inp));
  });
}

void gelu_backward(Tensor dinp, Tensor dout, Tensor inp) {
  const char* op = "gelu_backward";
  like(op, "dinp", dinp, "inp", inp);
  like(op, "dout", dout, "inp", inp);
  const bool vec = aligned16(dinp.data) && aligned16(dout.data) && aligned16(inp.data);
  DISPATCH_FLOAT(inp.dtype, T, op, {
    const GeluBackward<T> f{static_cast<T*>(dinp.data), static_cast<const T*>(dout.data),
                            static_cast<const T*>(inp.data)};
    launch_map("gelu_backward_kernel", f, inp.numel(), vec, "inp " + describe(inp));
  });
}

void swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  const char* op = "swiglu_forward";
  like(op, "out", out, "gate", gate);
  like(op, "up", up, "gate", gate);
  const bool vec = aligned16(out.data) && aligned16(gate.data) && aligned16(up.data);
  DISPATCH_FLOAT(gate.dtype, T, op, {
    const SwigluForward<T> f{static_cast<T*>(out.data), static_cast<const T*>(gate.data),
                             static_cast<const T*>(up.data)};
    launch_map("swiglu_forward_kernel", f, gate.numel(), vec, "gate " + describe(gate));
  });
}

void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  const char* op = "swiglu_backward";
  like(op, "dgate", dgate, "gate", gate);
  like(op, "dup", dup, "gate", gate);
  like(op, "dout", dout, "gate", gate);
  like(op, "up", up, "gate", gate);
  const bool vec = aligned16(dgate.data) && aligned16(dup.data) && aligned16(dout.data) &&
                   aligned16(gate.data) && aligned16(up.data);
  DISPATCH_FLOAT(gate.dtype, T, op, {
    const SwigluBackward<T> f{static_cast<T*>(dgate.data), static_cast<T*>(dup.data),
                              static_cast<const T*>(dout.data), static_cast<const T*>(gate.data),
                              static_cast<const T*>(up.data)};
    launch_map("swiglu_backward_kernel", f, gate.numel(), vec, "gate " + describe(gate));
  });
}

}  // namespace trainer::cuda
