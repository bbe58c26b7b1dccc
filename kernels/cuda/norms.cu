// RMSNorm and LayerNorm of the CUDA backend (see kernels/op_list.h), the same
// formulas as kernels/cpu/norms.cpp with fp32 arithmetic.
//
// Storage: x and dx share one type, out and dout another (a residual stream
// kept in F32 may feed a BF16 matmul input); weight, bias, dweight and dbias
// may each be F32, BF16 or F16 (small vectors, their type is switched at run
// time); mean and rstd are F32.
//
// Forward: one warp per row, 8 rows per block. The warp reads the row once for
// its statistics (LayerNorm: twice, mean then the centred variance, as the CPU
// does, so a large mean does not swallow the variance) and once more to write
// out; the re-reads hit L1/L2. Butterfly shuffles give every lane the same
// sum. Bytes ~ N*C*(sx + sy) + C*sw, FLOPs ~4 N*C.
//
// Backward: one block per group of R consecutive rows (R and so the grouping
// depend on N alone). For each row the block reduces the row's dot products
// (fixed-order block reduction), then updates dx (+=) and adds the row's
// dweight/dbias terms to per-column accumulators. Every thread always owns the
// same columns, so the accumulators need no atomics and no barriers; they live
// in shared memory (dynamic, C or 2C floats; beyond the device's opt-in limit
// they live directly in the global partial buffer instead). Each block writes
// its partial sums to a [G, C] scratch buffer, and a second kernel adds the G
// partials of each column in block order (fp64) into dweight/dbias. No float
// atomics anywhere: results are bitwise reproducible.
// Bytes ~ N*C*(3 sx + sy) (read x, dout, dx, write dx; the second read of a
// row for dx hits L1/L2) + 2*G*C*4 per accumulated vector, G <= 512;
// FLOPs ~10 N*C.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pack.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

using checks::fail;

constexpr int kPack = 8;
constexpr int kRowsPerBlock = 8;  // forward: warps (rows) per block
constexpr int kMaxBwdThreads = 256;
constexpr int kColumnThreads = 256;
constexpr int64_t kMinRowsPerGroup = 16;
constexpr int64_t kTargetGroups = 512;
constexpr size_t kDefaultSmem = 48 * 1024;  // static + dynamic, without opting in
constexpr size_t kStaticSmem = 32 * sizeof(float2);  // block_sum2's warp totals

// ---- argument checks ---------------------------------------------------------
// Shapes, row statistics and dtypes arrive checked by the router
// (kernels/checks/norms.cpp). What is CUDA's own: the width the kernels
// index, and dx sharing x's storage type (the backward kernel is templated
// on one type for both).

// x is [..., C] with C from the 1-D weight; returns the number of rows.
int64_t rows_of(const char* op, const Tensor& x, const Tensor& weight) {
  if (weight.dim(0) > (int64_t(1) << 30)) fail(op, "weight " + weight.shape_str() + " is too wide");
  return x.numel() / weight.dim(0);
}

void dtype_of_x(const char* op, const char* name, const Tensor& t, const Tensor& x) {
  if (t.dtype != x.dtype)
    fail(op, std::string(name) + " is " + dtype_name(t.dtype) + " but x is " + dtype_name(x.dtype) +
                 ": they must share one storage type");
}


std::string describe(const char* name, const Tensor& t) {
  return std::string(name) + " " + dtype_name(t.dtype) + t.shape_str();
}






// A C-length vector whose storage type is known only at run time (weight,
// bias, their gradients). The switch is uniform across the block.
struct AnyVec {
  void* p;
  DType dt;
};

AnyVec any_vec(const Tensor& t) { return AnyVec{t.data, t.dtype}; }

template <int P>
__device__ __forceinline__ void load_any(const AnyVec& a, int64_t i, float (&v)[P]) {
  switch (a.dt) {
    case DType::BF16: load_pack<__nv_bfloat16, P>(static_cast<const __nv_bfloat16*>(a.p) + i, v); break;
    case DType::F16: load_pack<__half, P>(static_cast<const __half*>(a.p) + i, v); break;
    default: load_pack<float, P>(static_cast<const float*>(a.p) + i, v); break;
  }
}

__device__ __forceinline__ void store_any(const AnyVec& a, int64_t i, float v) {
  switch (a.dt) {
    case DType::BF16: static_cast<__nv_bfloat16*>(a.p)[i] = __float2bfloat16(v); break;
    case DType::F16: static_cast<__half*>(a.p)[i] = __float2half(v); break;
    default: static_cast<float*>(a.p)[i] = v; break;
  }
}

// ---- reductions ----------------------------------------------------------------

// Butterfly: every lane ends with the same bits (each step adds the same two
// operands in every lane, and fp32 addition is commutative).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Every thread of the block gets the same sums: warp totals added in warp
// order by each thread. Must be reached by all threads of the block. The
// second barrier keeps the next call from overwriting totals still being read.
__device__ __forceinline__ float2 block_sum2(float2 v) {
  TRAINER_SHARED(float2, warp_total, [32]);
  v.x = warp_sum(v.x);
  v.y = warp_sum(v.y);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) warp_total[warp] = v;
  __syncthreads();
  float2 t = make_float2(0.f, 0.f);
  const int warps = int(blockDim.x) / 32;
  for (int w = 0; w < warps; ++w) {
    t.x += warp_total[w].x;
    t.y += warp_total[w].y;
  }
  __syncthreads();
  return t;
}

// ---- forward kernels -------------------------------------------------------------

template <typename TX, typename TY, int P>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    rmsnorm_forward_kernel(TY* out, float* rstd, const TX* x, AnyVec w, int64_t N, int C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= N) return;  // the whole warp leaves together: its shuffles stay full
  const TX* xr = x + row * C;
  float ss = 0.f;
  for (int c = lane * P; c < C; c += 32 * P) {
    float v[P];
    load_pack<TX, P>(xr + c, v);
#pragma unroll
    for (int k = 0; k < P; ++k) ss += v[k] * v[k];
  }
  ss = warp_sum(ss);
  const float r = 1.f / sqrtf(ss / float(C) + eps);
  TY* yr = out + row * C;
  for (int c = lane * P; c < C; c += 32 * P) {
    float v[P], wv[P];
    load_pack<TX, P>(xr + c, v);
    load_any<P>(w, c, wv);
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = v[k] * r * wv[k];
    store_pack<TY, P>(yr + c, v);
  }
  if (lane == 0) rstd[row] = r;
}

template <typename TX, typename TY, int P>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    layernorm_forward_kernel(TY* out, float* mean, float* rstd, const TX* x, AnyVec w, AnyVec b,
                             int64_t N, int C, float eps) {
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = int(threadIdx.x) % 32;
  if (row >= N) return;  // the whole warp leaves together: its shuffles stay full
  const TX* xr = x + row * C;
  float s = 0.f;
  for (int c = lane * P; c < C; c += 32 * P) {
    float v[P];
    load_pack<TX, P>(xr + c, v);
#pragma unroll
    for (int k = 0; k < P; ++k) s += v[k];
  }
  const float m = warp_sum(s) / float(C);
  float ss = 0.f;
  for (int c = lane * P; c < C; c += 32 * P) {
    float v[P];
    load_pack<TX, P>(xr + c, v);
#pragma unroll
    for (int k = 0; k < P; ++k) ss += (v[k] - m) * (v[k] - m);
  }
  const float r = 1.f / sqrtf(warp_sum(ss) / float(C) + eps);
  // Stored before the output pass, so that the row index and the mean/rstd
  // pointers are not live across it: on sm_80 ptxas otherwise spills 4-8
  // bytes to fit 48 registers (scripts/kernel_budgets.sh).
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
  const bool has_bias = b.p != nullptr;
  TY* yr = out + row * C;
  for (int c = lane * P; c < C; c += 32 * P) {
    float v[P], wv[P], bv[P];
    load_pack<TX, P>(xr + c, v);
    load_any<P>(w, c, wv);
    if (has_bias) {
      load_any<P>(b, c, bv);
    } else {
#pragma unroll
      for (int k = 0; k < P; ++k) bv[k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = ((v[k] - m) * r) * wv[k] + bv[k];
    store_pack<TY, P>(yr + c, v);
  }
}

// ---- backward kernels ------------------------------------------------------------
// Block b owns rows [b*R, min(N, (b+1)*R)). Thread t owns the columns
// c = t*P + j*blockDim.x*P (+0..P-1) in every loop below, so each accumulator
// element is only ever touched by one thread.

template <typename TX, typename TY, int P>
__global__ void __launch_bounds__(kMaxBwdThreads)
    rmsnorm_backward_kernel(TX* dx, float* partial_w, const TY* dout, const TX* x, AnyVec w,
                            const float* rstd, int64_t N, int C, int64_t rows_per_block, bool smem_acc) {
  TRAINER_DYNAMIC_SHARED(float, smem_acc_buf);
  float* acc = smem_acc ? smem_acc_buf : partial_w + int64_t(blockIdx.x) * C;
  const int step = int(blockDim.x) * P;
  for (int c = int(threadIdx.x) * P; c < C; c += step)
#pragma unroll
    for (int k = 0; k < P; ++k) acc[c + k] = 0.f;
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(N, r0 + rows_per_block);
  for (int64_t row = r0; row < r1; ++row) {  // same trip count in every thread
    const float r = rstd[row];
    const TY* gr = dout + row * C;
    const TX* xr = x + row * C;
    float dot = 0.f;
    for (int c = int(threadIdx.x) * P; c < C; c += step) {
      float g[P], xv[P], wv[P];
      load_pack<TY, P>(gr + c, g);
      load_pack<TX, P>(xr + c, xv);
      load_any<P>(w, c, wv);
#pragma unroll
      for (int k = 0; k < P; ++k) dot += g[k] * wv[k] * xv[k];
    }
    dot = block_sum2(make_float2(dot, 0.f)).x;
    // y = x r w, dr/dx_c = -r^3 x_c / C:  dx_c += r w_c g_c - r^3 x_c / C * sum_j g_j w_j x_j.
    const float bcoef = r * r * r * dot / float(C);
    TX* dxr = dx + row * C;
    for (int c = int(threadIdx.x) * P; c < C; c += step) {
      float g[P], xv[P], wv[P], d[P];
      load_pack<TY, P>(gr + c, g);
      load_pack<TX, P>(xr + c, xv);
      load_any<P>(w, c, wv);
      load_pack<TX, P>(dxr + c, d);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        d[k] += r * wv[k] * g[k] - bcoef * xv[k];
        acc[c + k] += g[k] * xv[k] * r;
      }
      store_pack<TX, P>(dxr + c, d);
    }
  }
  if (smem_acc) {
    float* out = partial_w + int64_t(blockIdx.x) * C;
    for (int c = int(threadIdx.x) * P; c < C; c += step)
#pragma unroll
      for (int k = 0; k < P; ++k) out[c + k] = acc[c + k];
  }
}

template <typename TX, typename TY, int P>
__global__ void __launch_bounds__(kMaxBwdThreads)
    layernorm_backward_kernel(TX* dx, float* partial_w, float* partial_b, const TY* dout, const TX* x,
                              AnyVec w, const float* mean, const float* rstd, int64_t N, int C,
                              int64_t rows_per_block, bool smem_acc) {
  TRAINER_DYNAMIC_SHARED(float, smem_acc_buf);
  const bool has_bias = partial_b != nullptr;
  float* acc_w = smem_acc ? smem_acc_buf : partial_w + int64_t(blockIdx.x) * C;
  float* acc_b = !has_bias ? nullptr : smem_acc ? smem_acc_buf + C : partial_b + int64_t(blockIdx.x) * C;
  const int step = int(blockDim.x) * P;
  for (int c = int(threadIdx.x) * P; c < C; c += step)
#pragma unroll
    for (int k = 0; k < P; ++k) {
      acc_w[c + k] = 0.f;
      if (has_bias) acc_b[c + k] = 0.f;
    }
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(N, r0 + rows_per_block);
  for (int64_t row = r0; row < r1; ++row) {  // same trip count in every thread
    const float m = mean[row], r = rstd[row];
    const TY* gr = dout + row * C;
    const TX* xr = x + row * C;
    float2 sums = make_float2(0.f, 0.f);  // sum(g w), sum(g w xhat)
    for (int c = int(threadIdx.x) * P; c < C; c += step) {
      float g[P], xv[P], wv[P];
      load_pack<TY, P>(gr + c, g);
      load_pack<TX, P>(xr + c, xv);
      load_any<P>(w, c, wv);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const float gh = g[k] * wv[k];
        sums.x += gh;
        sums.y += gh * ((xv[k] - m) * r);
      }
    }
    sums = block_sum2(sums);
    // With xhat = (x - mean) r and gh = g w: dx += r (gh - mean(gh) - xhat mean(gh xhat)).
    const float mg = sums.x / float(C), mgx = sums.y / float(C);
    TX* dxr = dx + row * C;
    for (int c = int(threadIdx.x) * P; c < C; c += step) {
      float g[P], xv[P], wv[P], d[P];
      load_pack<TY, P>(gr + c, g);
      load_pack<TX, P>(xr + c, xv);
      load_any<P>(w, c, wv);
      load_pack<TX, P>(dxr + c, d);
#pragma unroll
      for (int k = 0; k < P; ++k) {
        const float xhat = (xv[k] - m) * r;
        d[k] += r * (g[k] * wv[k] - mg - xhat * mgx);
        acc_w[c + k] += g[k] * xhat;
        if (has_bias) acc_b[c + k] += g[k];
      }
      store_pack<TX, P>(dxr + c, d);
    }
  }
  if (smem_acc) {
    const int64_t base = int64_t(blockIdx.x) * C;
    for (int c = int(threadIdx.x) * P; c < C; c += step)
#pragma unroll
      for (int k = 0; k < P; ++k) {
        partial_w[base + c + k] = acc_w[c + k];
        if (has_bias) partial_b[base + c + k] = acc_b[c + k];
      }
  }
}

// grad[c] += sum over groups g = 0..G-1, in that order, of partial[g, c].
__global__ void __launch_bounds__(kColumnThreads)
    column_sum_kernel(AnyVec grad, const float* partial, int64_t groups, int C) {
  const int c = int(blockIdx.x) * kColumnThreads + int(threadIdx.x);
  if (c >= C) return;
  double s = 0.0;
  for (int64_t g = 0; g < groups; ++g) s += double(partial[g * C + c]);
  float cur[1];
  load_any<1>(grad, c, cur);
  store_any(grad, c, cur[0] + float(s));
}

// ---- host side ---------------------------------------------------------------------

// Grow-only device scratch for the backward partial sums, kept for the life
// of the process (freed with the context at exit). Reuse across calls is safe
// because every op runs on cuda::stream(): a later call's kernels start after
// an earlier call's column sums have read the partials. Growing first waits
// for the stream so no running kernel loses its buffer. One host thread
// issues the ops (the mutex only guards the allocation).
float* partial_scratch(size_t floats, const std::string& context) {
  static std::mutex mu;
  static float* p = nullptr;
  static size_t have = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (floats > have) {
    if (p != nullptr) {
      CUDA_CHECK(cudaStreamSynchronize(stream()), "norm backward scratch grow, " + context);
      CUDA_CHECK(cudaFree(p), "norm backward scratch grow, " + context);
      p = nullptr;
      have = 0;
    }
    const size_t want = std::max(floats, size_t(1) << 20);
    CUDA_CHECK(cudaMalloc(&p, want * sizeof(float)), "norm backward scratch (" + std::to_string(want * 4) +
                                                         " bytes), " + context);
    have = want;
  }
  return p;
}

size_t smem_optin_limit() {
  static const size_t limit = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev), "norm backward: device");
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
               "norm backward: shared memory limit");
    return size_t(v);
  }();
  return limit;
}

struct BwdLaunch {
  int64_t rows_per_block, groups;
  int threads;
  bool smem_acc;
  size_t smem_bytes;
};

// The row grouping depends on N only, so the summation order (and the bits
// of dweight) does not depend on the GPU.
BwdLaunch plan_backward(int64_t N, int C, int P, int accumulators) {
  BwdLaunch l{};
  l.rows_per_block = std::max(kMinRowsPerGroup, (N + kTargetGroups - 1) / kTargetGroups);
  l.groups = (N + l.rows_per_block - 1) / l.rows_per_block;
  const int64_t packs = (int64_t(C) + P - 1) / P;
  l.threads = int(std::clamp<int64_t>((packs + 31) / 32 * 32, 32, kMaxBwdThreads));
  const size_t bytes = size_t(C) * sizeof(float) * size_t(accumulators);
  l.smem_acc = bytes + kStaticSmem <= std::max(kDefaultSmem, smem_optin_limit());
  l.smem_bytes = l.smem_acc ? bytes : 0;
  return l;
}

// Above 48 KB per block (static + dynamic) a kernel must opt in.
template <typename Kernel>
void allow_smem(Kernel kernel, const BwdLaunch& l, const std::string& context) {
  if (l.smem_bytes + kStaticSmem > kDefaultSmem)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem_bytes)),
               context);
}

void column_sums(AnyVec grad, const float* partial, int64_t groups, int C, const std::string& context) {
  const int blocks = (C + kColumnThreads - 1) / kColumnThreads;
  launch(column_sum_kernel, blocks, kColumnThreads, 0, stream(), grad, partial, groups, C);
  KERNEL_CHECK("column_sum_kernel", context);
}

unsigned forward_blocks(const char* op, int64_t N) {
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  if (blocks > 0x7fffffff) fail(op, std::to_string(N) + " rows are too many for one launch");
  return unsigned(blocks);
}

}  // namespace

void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  const char* op = "rmsnorm_forward";
  const int64_t N = rows_of(op, x, weight);
  const int C = int(weight.dim(0));
  if (N == 0) return;
  const bool vec = C % kPack == 0 && aligned16(out.data) && aligned16(x.data) && aligned16(weight.data);
  const std::string context = describe("x", x) + " " + describe("out", out) + " " + describe("weight", weight);
  const unsigned blocks = forward_blocks(op, N);
  DISPATCH_FLOAT(x.dtype, TX, op, DISPATCH_FLOAT(out.dtype, TY, op, {
    TY* o = static_cast<TY*>(out.data);
    const TX* xp = static_cast<const TX*>(x.data);
    if (vec)
      launch(rmsnorm_forward_kernel<TX, TY, kPack>, blocks, kRowsPerBlock * 32, 0, stream(), o, rstd.f32(), xp,
             any_vec(weight), N, C, eps);
    else
      launch(rmsnorm_forward_kernel<TX, TY, 1>, blocks, kRowsPerBlock * 32, 0, stream(), o, rstd.f32(), xp,
             any_vec(weight), N, C, eps);
    KERNEL_CHECK("rmsnorm_forward_kernel", context);
  }));
}

void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd) {
  const char* op = "rmsnorm_backward";
  const int64_t N = rows_of(op, x, weight);
  const int C = int(weight.dim(0));
  dtype_of_x(op, "dx", dx, x);
  if (N == 0) return;
  const bool vec = C % kPack == 0 && aligned16(dx.data) && aligned16(dout.data) && aligned16(x.data) &&
                   aligned16(weight.data);
  const int P = vec ? kPack : 1;
  const std::string context = describe("x", x) + " " + describe("dout", dout) + " " + describe("weight", weight) +
                              " " + describe("dweight", dweight);
  const BwdLaunch l = plan_backward(N, C, P, 1);
  float* partial = partial_scratch(size_t(l.groups) * size_t(C), context);
  DISPATCH_FLOAT(x.dtype, TX, op, DISPATCH_FLOAT(dout.dtype, TY, op, {
    TX* d = static_cast<TX*>(dx.data);
    const TY* g = static_cast<const TY*>(dout.data);
    const TX* xp = static_cast<const TX*>(x.data);
    if (vec) {
      auto kernel = rmsnorm_backward_kernel<TX, TY, kPack>;
      allow_smem(kernel, l, context);
      launch(kernel, unsigned(l.groups), l.threads, l.smem_bytes, stream(), d, partial, g, xp, any_vec(weight),
             rstd.f32(), N, C, l.rows_per_block, l.smem_acc);
    } else {
      auto kernel = rmsnorm_backward_kernel<TX, TY, 1>;
      allow_smem(kernel, l, context);
      launch(kernel, unsigned(l.groups), l.threads, l.smem_bytes, stream(), d, partial, g, xp, any_vec(weight),
             rstd.f32(), N, C, l.rows_per_block, l.smem_acc);
    }
    KERNEL_CHECK("rmsnorm_backward_kernel", context);
  }));
  column_sums(any_vec(dweight), partial, l.groups, C, "dweight, " + context);
}

void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias, float eps) {
  const char* op = "layernorm_forward";
  const int64_t N = rows_of(op, x, weight);
  const int C = int(weight.dim(0));
  if (N == 0) return;
  const bool vec = C % kPack == 0 && aligned16(out.data) && aligned16(x.data) && aligned16(weight.data) &&
                   aligned16(bias.data);  // nullptr counts as aligned
  const AnyVec b = bias.empty() ? AnyVec{nullptr, DType::F32} : any_vec(bias);
  const std::string context = describe("x", x) + " " + describe("out", out) + " " + describe("weight", weight);
  const unsigned blocks = forward_blocks(op, N);
  DISPATCH_FLOAT(x.dtype, TX, op, DISPATCH_FLOAT(out.dtype, TY, op, {
    TY* o = static_cast<TY*>(out.data);
    const TX* xp = static_cast<const TX*>(x.data);
    if (vec)
      launch(layernorm_forward_kernel<TX, TY, kPack>, blocks, kRowsPerBlock * 32, 0, stream(), o, mean.f32(),
             rstd.f32(), xp, any_vec(weight), b, N, C, eps);
    else
      launch(layernorm_forward_kernel<TX, TY, 1>, blocks, kRowsPerBlock * 32, 0, stream(), o, mean.f32(), rstd.f32(),
             xp, any_vec(weight), b, N, C, eps);
    KERNEL_CHECK("layernorm_forward_kernel", context);
  }));
}

void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x, Tensor weight,
                        Tensor mean, Tensor rstd) {
  const char* op = "layernorm_backward";
  const int64_t N = rows_of(op, x, weight);
  const int C = int(weight.dim(0));
  dtype_of_x(op, "dx", dx, x);
  const bool has_bias = !dbias.empty();
  if (N == 0) return;
  const bool vec = C % kPack == 0 && aligned16(dx.data) && aligned16(dout.data) && aligned16(x.data) &&
                   aligned16(weight.data);
  const int P = vec ? kPack : 1;
  const std::string context = describe("x", x) + " " + describe("dout", dout) + " " + describe("weight", weight) +
                              " " + describe("dweight", dweight);
  const BwdLaunch l = plan_backward(N, C, P, has_bias ? 2 : 1);
  const size_t per_vector = size_t(l.groups) * size_t(C);
  float* partial_w = partial_scratch(per_vector * (has_bias ? 2 : 1), context);
  float* partial_b = has_bias ? partial_w + per_vector : nullptr;
  DISPATCH_FLOAT(x.dtype, TX, op, DISPATCH_FLOAT(dout.dtype, TY, op, {
    TX* d = static_cast<TX*>(dx.data);
    const TY* g = static_cast<const TY*>(dout.data);
    const TX* xp = static_cast<const TX*>(x.data);
    if (vec) {
      auto kernel = layernorm_backward_kernel<TX, TY, kPack>;
      allow_smem(kernel, l, context);
      launch(kernel, unsigned(l.groups), l.threads, l.smem_bytes, stream(), d, partial_w, partial_b, g, xp,
             any_vec(weight), mean.f32(), rstd.f32(), N, C, l.rows_per_block, l.smem_acc);
    } else {
      auto kernel = layernorm_backward_kernel<TX, TY, 1>;
      allow_smem(kernel, l, context);
      launch(kernel, unsigned(l.groups), l.threads, l.smem_bytes, stream(), d, partial_w, partial_b, g, xp,
             any_vec(weight), mean.f32(), rstd.f32(), N, C, l.rows_per_block, l.smem_acc);
    }
    KERNEL_CHECK("layernorm_backward_kernel", context);
  }));
  column_sums(any_vec(dweight), partial_w, l.groups, C, "dweight, " + context);
  if (has_bias) column_sums(any_vec(dbias), partial_b, l.groups, C, "dbias, " + context);
}

}  // namespace trainer::cuda
