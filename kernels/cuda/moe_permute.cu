// MoE permutation of the CUDA backend; semantics of the moe_*permute ops in
// kernels/op_list.h, matching the CPU reference (kernels/cpu/moe_permute.cpp)
// row for row.
//
// Permutation: gathers, never float atomics. moe_permute and the dyp part of
// moe_unpermute_backward first invert row_map (row -> assignment, -1 for
// unused rows; N*K ints of scratch), then write every permuted row exactly
// once: a copy (16-byte units when rows allow), a scaled row, or zeros for
// the unused tail. moe_permute_backward and moe_unpermute gather per token,
// adding the K rows in k order in fp32 (the CPU's order). dtopk_w is one warp
// per assignment: a dot product in double, reduced by a fixed shuffle tree.
// Each is one pass over its rows: bytes = (rows read + rows written) * C *
// sizeof(T).
//
// Row maps are trusted as moe_dispatch_plan made them (the CPU validates them
// on the host; here that would cost a sync per call): entries outside
// [-1, N*K) are skipped, never dereferenced. Shapes arrive checked by the
// router (kernels/checks/moe_permute.cpp).
#include <climits>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/moe_common.cuh"

namespace trainer::cuda {
namespace {

using namespace moe_detail;

// A token-side and an expert-side tensor share one storage type: the
// kernels are templated on it.
void same_dtype(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  if (a.dtype != b.dtype)
    fail(op, std::string(an) + " " + a.shape_str() + " is " + dtype_name(a.dtype) + " but " + bn + " " +
                 b.shape_str() + " is " + dtype_name(b.dtype) + "; they must share one storage type");
}

// ---- permutation ----------------------------------------------------------------------

// inv[r] = a for r = R[a] in [0, NK); inv starts at -1 (memset 0xff).
__global__ void invert_row_map_kernel(const int32_t* R, int64_t NK, int32_t* inv) {
  for (int64_t a = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; a < NK; a += int64_t(gridDim.x) * blockDim.x) {
    const int32_t r = R[a];
    if (r >= 0 && r < NK) inv[r] = int32_t(a);
  }
}

// One warp per permuted row: a copy of its token's row, or zeros. U is the
// copy unit (16, 4 or 2 bytes); units = row bytes / sizeof(U).
template <typename U>
__global__ void permute_rows_kernel(U* xp, const U* x, const int32_t* inv, int64_t NK, int K, int64_t units) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); r < NK; r += warps) {
    const int32_t a = inv[r];
    U* dst = xp + r * units;
    if (a >= 0) {
      const U* src = x + (int64_t(a) / K) * units;
      for (int64_t u = lane; u < units; u += 32) dst[u] = src[u];
    } else {
      for (int64_t u = lane; u < units; u += 32) dst[u] = U{};
    }
  }
}

// dx[n,:] += sum over kept k (in k order) of dxp[R[n,k],:], in fp32.
template <typename T>
__global__ void permute_backward_kernel(T* dx, const T* dxp, const int32_t* R, int64_t N, int K, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t NK = N * int64_t(K);
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t n = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); n < N; n += warps) {
    const int32_t* rm = R + n * K;
    for (int64_t c = lane; c < C; c += 32) {
      float acc = to_float(dx[n * C + c]);
      for (int k = 0; k < K; ++k) {
        const int32_t r = rm[k];
        if (r >= 0 && r < NK) acc += to_float(dxp[int64_t(r) * C + c]);
      }
      dx[n * C + c] = from_float<T>(acc);
    }
  }
}

// y[n,:] = sum over kept k (in k order) of w[n,k] * yp[R[n,k],:]. Products
// and sums are rounded separately (no FMA), as the CPU loop computes them.
template <typename T>
__global__ void unpermute_kernel(T* y, const T* yp, const int32_t* R, const float* W, int64_t N, int K, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t NK = N * int64_t(K);
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t n = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); n < N; n += warps) {
    const int32_t* rm = R + n * K;
    const float* w = W + n * K;
    for (int64_t c = lane; c < C; c += 32) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) {
        const int32_t r = rm[k];
        if (r >= 0 && r < NK) acc = __fadd_rn(acc, __fmul_rn(w[k], to_float(yp[int64_t(r) * C + c])));
      }
      y[n * C + c] = from_float<T>(acc);
    }
  }
}

// dyp[r,:] = w[a] * dy[a/K,:] for the assignment a that owns row r, else 0.
template <typename T>
__global__ void unpermute_backward_rows_kernel(T* dyp, const T* dy, const int32_t* inv, const float* W, int64_t NK,
                                               int K, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t r = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); r < NK; r += warps) {
    const int32_t a = inv[r];
    T* dst = dyp + r * C;
    if (a >= 0) {
      const float w = W[a];
      const T* g = dy + (int64_t(a) / K) * C;
      for (int64_t c = lane; c < C; c += 32) dst[c] = from_float<T>(__fmul_rn(w, to_float(g[c])));
    } else {
      for (int64_t c = lane; c < C; c += 32) dst[c] = from_float<T>(0.f);
    }
  }
}

// dtopk_w[a] = dot(dy[a/K,:], yp[R[a],:]) for kept a, 0 for dropped. One
// warp per assignment; double lane sums, fixed xor-shuffle tree.
template <typename T>
__global__ void dtopk_w_kernel(float* DW, const T* dy, const T* yp, const int32_t* R, int64_t N, int K, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t NK = N * int64_t(K);
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t a = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5); a < NK; a += warps) {
    const int32_t r = R[a];
    double s = 0;
    if (r >= 0 && r < NK) {
      const T* g = dy + (a / K) * C;
      const T* v = yp + int64_t(r) * C;
      for (int64_t c = lane; c < C; c += 32) s += double(to_float(g[c])) * double(to_float(v[c]));
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) DW[a] = float(s);
  }
}

// Fills inv[0, NK) with the inverse of row_map; the caller holds
// scratch_mutex() until its kernels reading inv are enqueued.
int32_t* invert_row_map(const char* op, const Tensor& row_map) {
  const int64_t NK = row_map.numel();
  auto* inv = static_cast<int32_t*>(scratch(size_t(NK) * sizeof(int32_t), op));
  CUDA_CHECK(cudaMemsetAsync(inv, 0xff, size_t(NK) * sizeof(int32_t), stream()),
             std::string(op) + ": inverse of row_map " + row_map.shape_str());
  launch(invert_row_map_kernel, blocks_for(NK, kThreads), kThreads, 0, stream(), row_map.i32(), NK, inv);
  KERNEL_CHECK("invert_row_map_kernel", std::string(op) + ": row_map " + row_map.shape_str());
  return inv;
}

}  // namespace


// ---- permutation ops ------------------------------------------------------------------------

void moe_permute(Tensor xp, Tensor x, Tensor row_map) {
  const char* op = "moe_permute";
  same_dtype(op, "x", x, "xp", xp);
  const int64_t K = row_map.dim(1), NK = row_map.numel(), C = x.dim(1);
  if (NK == 0 || C == 0) return;
  const std::string ctx = std::string(op) + ": x " + x.shape_str() + " " + dtype_name(x.dtype) + " -> xp " +
                          xp.shape_str() + ", row_map " + row_map.shape_str();
  // The copy is dtype-blind: widest unit that divides the row and both bases.
  const size_t row_bytes = size_t(C) * dtype_size(x.dtype);
  const auto base = reinterpret_cast<uintptr_t>(x.data) | reinterpret_cast<uintptr_t>(xp.data);
  std::lock_guard<std::mutex> lock(scratch_mutex());
  const int32_t* inv = invert_row_map(op, row_map);
  const unsigned blocks = blocks_for(NK, kWarpsPerBlock);
  if (row_bytes % 16 == 0 && base % 16 == 0) {
    launch(permute_rows_kernel<uint4>, blocks, kThreads, 0, stream(), static_cast<uint4*>(xp.data),
           static_cast<const uint4*>(x.data), inv, NK, int(K), int64_t(row_bytes / 16));
  } else if (row_bytes % 4 == 0 && base % 4 == 0) {
    launch(permute_rows_kernel<uint32_t>, blocks, kThreads, 0, stream(), static_cast<uint32_t*>(xp.data),
           static_cast<const uint32_t*>(x.data), inv, NK, int(K), int64_t(row_bytes / 4));
  } else {
    launch(permute_rows_kernel<uint16_t>, blocks, kThreads, 0, stream(), static_cast<uint16_t*>(xp.data),
           static_cast<const uint16_t*>(x.data), inv, NK, int(K), int64_t(row_bytes / 2));
  }
  KERNEL_CHECK("permute_rows_kernel", ctx);
}

void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map) {
  const char* op = "moe_permute_backward";
  same_dtype(op, "dx", dx, "dxp", dxp);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = dx.dim(1);
  if (N == 0 || K == 0 || C == 0) return;
  DISPATCH_FLOAT(dx.dtype, T, op, {
    launch(permute_backward_kernel<T>, blocks_for(N, kWarpsPerBlock), kThreads, 0, stream(), static_cast<T*>(dx.data),
           static_cast<const T*>(dxp.data), row_map.i32(), N, int(K), C);
    KERNEL_CHECK("permute_backward_kernel", std::string(op) + ": dx " + dx.shape_str() + " " +
                                                dtype_name(dx.dtype) + ", dxp " + dxp.shape_str());
  });
}

void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w) {
  const char* op = "moe_unpermute";
  same_dtype(op, "y", y, "yp", yp);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = y.dim(1);
  if (N == 0 || C == 0) return;
  // K == 0 still runs: every token's y is zero then.
  DISPATCH_FLOAT(y.dtype, T, op, {
    launch(unpermute_kernel<T>, blocks_for(N, kWarpsPerBlock), kThreads, 0, stream(), static_cast<T*>(y.data),
           static_cast<const T*>(yp.data), row_map.i32(), topk_w.f32(), N, int(K), C);
    KERNEL_CHECK("unpermute_kernel", std::string(op) + ": y " + y.shape_str() + " " + dtype_name(y.dtype) +
                                         ", yp " + yp.shape_str());
  });
}

void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map, Tensor topk_w) {
  const char* op = "moe_unpermute_backward";
  same_dtype(op, "dy", dy, "dyp", dyp);
  same_dtype(op, "dy", dy, "yp", yp);
  // dtopk_w may be absent when the router is not being trained.
  const bool have_dw = !dtopk_w.empty();
  const int64_t N = row_map.dim(0), K = row_map.dim(1), NK = row_map.numel(), C = dy.dim(1);
  if (NK == 0) return;
  const std::string ctx = std::string(op) + ": dy " + dy.shape_str() + " " + dtype_name(dy.dtype) + ", dyp " +
                          dyp.shape_str() + ", row_map " + row_map.shape_str();
  DISPATCH_FLOAT(dy.dtype, T, op, {
    if (C > 0) {
      std::lock_guard<std::mutex> lock(scratch_mutex());
      const int32_t* inv = invert_row_map(op, row_map);
      launch(unpermute_backward_rows_kernel<T>, blocks_for(NK, kWarpsPerBlock), kThreads, 0, stream(),
             static_cast<T*>(dyp.data), static_cast<const T*>(dy.data), inv, topk_w.f32(), NK, int(K), C);
      KERNEL_CHECK("unpermute_backward_rows_kernel", ctx);
    }
    if (have_dw) {
      launch(dtopk_w_kernel<T>, blocks_for(NK, kWarpsPerBlock), kThreads, 0, stream(), dtopk_w.f32(),
             static_cast<const T*>(dy.data), static_cast<const T*>(yp.data), row_map.i32(), N, int(K), C);
      KERNEL_CHECK("dtopk_w_kernel", ctx);
    }
  });
}

}  // namespace trainer::cuda

