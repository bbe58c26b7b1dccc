// Element types on the GPU: storage in bf16, fp16 or fp32, arithmetic in fp32.
// DISPATCH_FLOAT(dtype, T, body) instantiates body with T = the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "core/tensor.h"

namespace trainer::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

}  // namespace trainer::cuda

#define DISPATCH_FLOAT(dtype, T, op_name, ...)                                               \
  do {                                                                                       \
    switch (dtype) {                                                                         \
      case ::trainer::DType::F32: { using T = float; __VA_ARGS__; } break;                   \
      case ::trainer::DType::BF16: { using T = __nv_bfloat16; __VA_ARGS__; } break;          \
      case ::trainer::DType::F16: { using T = __half; __VA_ARGS__; } break;                  \
      default:                                                                               \
        throw std::invalid_argument(std::string(op_name) + ": unsupported dtype " +          \
                                    ::trainer::dtype_name(dtype));                           \
    }                                                                                        \
  } while (0)
