// Fused softmax cross-entropy (forward + backward) of the CUDA backend; the
// semantics are those of ops::cross_entropy_forward_backward (kernels/op_list.h).
//
// Algorithm: one thread block per row (token), 128-1024 threads looping over
// the V logits, so any vocabulary size works (V = 256k included).
//   pass 1: every thread keeps an online (max, sum-exp) pair in fp32 over its
//           share of the row, read with 16-byte loads after a scalar head that
//           reaches 16-byte alignment (scalar tail likewise); the pairs are
//           merged warp by warp in a fixed order (deterministic). The sum
//           leaves out the target: s_other = sum_{j != t} exp(x_j - max), so
//           the loss of a confident prediction, log1p(s_other) when the target
//           is the max, and its gradient p_t - 1 = -s_other / s keep their
//           digits instead of cancelling.
//   pass 2 (only if dlogits is non-empty): dlogits[j] = exp(x_j - max) *
//           grad_scale / s for j != t, -s_other * grad_scale / s at the target,
//           written in the dlogits dtype (vector stores when its row is
//           aligned like the logits row). No probability tensor is stored.
//           dlogits may alias logits (same data, same dtype): every element is
//           read by the thread that then overwrites it, pass 1 has finished
//           for the whole block (barrier in the reduction) before any write,
//           and the target logit is read before the first barrier.
// Targets < 0: loss 0, zero gradient row. Target >= V (the CPU backend
// throws; the device cannot without a sync): loss NaN and a NaN gradient row,
// so the engine's finiteness check on the loss (and grad norm) catches it.
// Non-finite logits give NaN losses as well.
//
// Cost per row: reads V logits once (pass 1) and once more in pass 2 (often
// from L2) and writes V gradients: (2 * in + out) bytes per logit, 4 B/row
// loss; about 2 exp + 6 flops per logit. Memory bound on H100/H200 for V >=
// 32k with bf16 logits.
//
// Vocabulary-parallel pair (same file: it shares the row split, the online
// merge and the block reduction), each one block per row:
//   cross_entropy_partial_stats: pass 1 over the valid columns only, the
//     target included in the sum (the other ranks' columns are summed
//     elsewhere, so there is no s_other to keep), then thread 0 writes
//     (m, s, t). A target >= vocab_size (the CPU throws) gets t = NaN.
//   cross_entropy_vocab_parallel: thread 0 combines the P ranks' stats in
//     double (M, sum, lse, loss, the target gradient) and hands the block
//     fp32 factors through shared memory; then one pass over the whole local
//     row writes exp(x - M) * (grad_scale / sum) in the valid columns, 0 in
//     the padding. Nothing is read from logits before that pass, and every
//     element is read by the thread that then overwrites it, so dlogits may
//     be logits.
//   Cost: stats read Vl logits per row; the second op reads them again and
//   writes Vl gradients, plus P*12 bytes of stats per row.
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

constexpr const char* kOp = "cross_entropy_forward_backward";

// 16 bytes of T: the unit of a vectorised load.
template <typename T> constexpr int kVec = 16 / int(sizeof(T));

// N values of T, aligned to their size but at most to 16 bytes (the widest
// load/store the compiler may emit from it), so a 32-byte Pack of 8 floats
// needs only 16-byte alignment and becomes two 16-byte accesses.
template <typename T, int N>
struct alignas(sizeof(T) * N < 16 ? sizeof(T) * N : 16) Pack {
  T v[N];
};

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }

// Online (max, sum) merge: sum is relative to max. `ref` keeps an all -inf
// pair at (-inf, 0) instead of exp(-inf - -inf) = NaN; NaN inputs still
// propagate through the sums (fmaxf drops NaN from the max, exp keeps it).
__device__ __forceinline__ float safe_ref(float m) { return m == -INFINITY ? 0.f : m; }

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  const float nm = fmaxf(m, m2);
  const float ref = safe_ref(nm);
  s = s * expf(m - ref) + s2 * expf(m2 - ref);
  m = nm;
}

// Block-wide merge of the per-thread pairs; every thread gets the result.
// Fixed order (shuffle-down tree in each warp, then warp 0 over the warps),
// so the result depends only on the data and blockDim: deterministic.
__device__ __forceinline__ void block_merge(float& m, float& s) {
  TRAINER_SHARED(float, sm, [32]);
  TRAINER_SHARED(float, ss, [32]);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_down_sync(0xffffffffu, m, off);
    const float s2 = __shfl_down_sync(0xffffffffu, s, off);
    merge(m, s, m2, s2);
  }
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < nwarps ? sm[lane] : -INFINITY;
    s = lane < nwarps ? ss[lane] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float m2 = __shfl_down_sync(0xffffffffu, m, off);
      const float s2 = __shfl_down_sync(0xffffffffu, s, off);
      merge(m, s, m2, s2);
    }
    if (lane == 0) {
      sm[0] = m;
      ss[0] = s;
    }
  }
  __syncthreads();
  m = sm[0];
  s = ss[0];
}

// Stores VEC gradient values at out[0..VEC): one packed store when `packed`
// (out aligned to the Pack), else element by element.
template <typename Tout, int VEC>
__device__ __forceinline__ void store_vec(Tout* out, const float (&d)[VEC], bool packed) {
  if (packed) {
    Pack<Tout, VEC> p;
#pragma unroll
    for (int k = 0; k < VEC; ++k) p.v[k] = from_float<Tout>(d[k]);
    *reinterpret_cast<Pack<Tout, VEC>*>(out) = p;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[k] = from_float<Tout>(d[k]);
  }
}

// One block per row. logits/dlogits may be the same memory: no __restrict__,
// plain (coherent) loads.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(1024)
    cross_entropy_kernel(float* losses, Tout* dlogits, const Tin* logits, const int32_t* targets,
                         int64_t V, float grad_scale) {
  constexpr int VEC = kVec<Tin>;
  const int64_t row = blockIdx.x;
  const Tin* x = logits + row * V;
  Tout* dx = dlogits == nullptr ? nullptr : dlogits + row * V;
  const int32_t t = targets[row];
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;

  // Row partition by the alignment of the logits row: scalar head up to a
  // 16-byte boundary, VEC-wide body, scalar tail. Pass 2 uses the same
  // partition; its stores are packed when the dlogits row has the same
  // phase (always true in place).
  const int64_t mis = int64_t(reinterpret_cast<uintptr_t>(x) & 15) / int64_t(sizeof(Tin));
  int64_t head = mis == 0 ? 0 : VEC - mis;
  if (head > V) head = V;
  const int64_t nvec = (V - head) / VEC;
  const int64_t body_end = head + nvec * VEC;
  const int64_t nscalar = head + (V - body_end);  // head + tail elements
  constexpr uintptr_t kOutAlign = alignof(Pack<Tout, VEC>);
  const bool packed_out =
      dx != nullptr && (reinterpret_cast<uintptr_t>(dx + head) & (kOutAlign - 1)) == 0;
  // Scalar index k in [0, nscalar) -> element index.
  auto scalar_index = [&](int64_t k) { return k < head ? k : body_end + (k - head); };

  if (t < 0 || t >= V) {
    // Ignored (0) or out of the vocabulary (NaN): no pass 1. Uniform per
    // block, so returning before any barrier is safe.
    const float fillv = t < 0 ? 0.f : nan_f();
    if (tid == 0) losses[row] = fillv;
    if (dx == nullptr) return;
    float d[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) d[k] = fillv;
    for (int64_t i = tid; i < nvec; i += nthreads) store_vec<Tout, VEC>(dx + head + i * VEC, d, packed_out);
    for (int64_t k = tid; k < nscalar; k += nthreads) dx[scalar_index(k)] = from_float<Tout>(fillv);
    return;
  }

  // Read before the first barrier: after it, pass 2 may overwrite x[t].
  const float xt = to_float(x[t]);

  // ---- pass 1: online max and sum of exp over j != t ----
  float m = -INFINITY;
  float s = 0.f;
  for (int64_t i = tid; i < nvec; i += nthreads) {
    const int64_t j0 = head + i * VEC;
    const Pack<Tin, VEC> p = *reinterpret_cast<const Pack<Tin, VEC>*>(x + j0);
    float xs[VEC];
    float lm = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      xs[k] = to_float(p.v[k]);
      lm = fmaxf(lm, xs[k]);
    }
    const float nm = fmaxf(m, lm);
    const float ref = safe_ref(nm);
    float acc = s * expf(m - ref);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float e = expf(xs[k] - ref);
      acc += (j0 + k == t) ? 0.f : e;
    }
    s = acc;
    m = nm;
  }
  for (int64_t k = tid; k < nscalar; k += nthreads) {
    const int64_t j = scalar_index(k);
    const float xj = to_float(x[j]);
    merge(m, s, xj, j == t ? 0.f : 1.f);
  }
  block_merge(m, s);

  // s_other = s; total s_all = s_other + exp(xt - m).
  const float et = expf(xt - safe_ref(m));
  const float s_all = s + et;
  if (tid == 0) {
    float loss;
    if (!(fabsf(m) < INFINITY)) {
      loss = nan_f();  // all -inf, +inf or NaN in the row
    } else if (xt == m) {
      loss = log1pf(s);  // target is the max: log(1 + s_other), no cancellation
    } else {
      loss = (m - xt) + logf(s_all);  // NaN when xt is NaN
    }
    losses[row] = loss;
  }
  if (dx == nullptr) return;

  // ---- pass 2: dlogits = (softmax - onehot) * grad_scale ----
  const float inv = grad_scale / s_all;
  const float dt = -s * inv;  // (p_t - 1) * grad_scale = -s_other / s_all * grad_scale
  const float ref = safe_ref(m);
  for (int64_t i = tid; i < nvec; i += nthreads) {
    const int64_t j0 = head + i * VEC;
    const Pack<Tin, VEC> p = *reinterpret_cast<const Pack<Tin, VEC>*>(x + j0);
    float d[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float g = expf(to_float(p.v[k]) - ref) * inv;
      d[k] = (j0 + k == t) ? dt : g;
    }
    store_vec<Tout, VEC>(dx + j0, d, packed_out);
  }
  for (int64_t k = tid; k < nscalar; k += nthreads) {
    const int64_t j = scalar_index(k);
    const float g = expf(to_float(x[j]) - ref) * inv;
    dx[j] = from_float<Tout>(j == t ? dt : g);
  }
}

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(std::string(kOp) + ": " + what); }

// Threads per row: enough for about 4 vector loads per thread, 128 to 1024.
// A pure function of V and the logits dtype, so results are reproducible.
int threads_for(int64_t V, int vec) {
  int threads = 128;
  while (threads < 1024 && int64_t(threads) * vec * 4 < V) threads *= 2;
  return threads;
}

// ---- vocabulary-parallel pair ---------------------------------------------------

// A row of `len` elements from x split into a scalar head up to the first
// 16-byte boundary, a body of 16-byte packs and a scalar tail (the fused
// kernel's partition, by the logits' alignment).
template <typename T>
struct RowParts {
  static constexpr int VEC = kVec<T>;
  int64_t head, nvec, body_end, nscalar;
  __device__ RowParts(const T* x, int64_t len) {
    const int64_t mis = int64_t(reinterpret_cast<uintptr_t>(x) & 15) / int64_t(sizeof(T));
    head = mis == 0 ? 0 : VEC - mis;
    if (head > len) head = len;
    nvec = (len - head) / VEC;
    body_end = head + nvec * VEC;
    nscalar = head + (len - body_end);
  }
  // Scalar index k in [0, nscalar) -> element index.
  __device__ int64_t scalar_index(int64_t k) const { return k < head ? k : body_end + (k - head); }
};

template <typename Tin>
__global__ void __launch_bounds__(1024)
    partial_stats_kernel(float* stats, const Tin* logits, const int32_t* targets, int64_t Vl,
                         int64_t valid, int64_t vocab_offset, int64_t vocab_size) {
  constexpr int VEC = kVec<Tin>;
  const int64_t row = blockIdx.x;
  const Tin* x = logits + row * Vl;
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  const RowParts<Tin> parts(x, valid);

  float m = -INFINITY;
  float s = 0.f;
  for (int64_t i = tid; i < parts.nvec; i += nthreads) {
    const Pack<Tin, VEC> p = *reinterpret_cast<const Pack<Tin, VEC>*>(x + parts.head + i * VEC);
    float xs[VEC];
    float lm = -INFINITY;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      xs[k] = to_float(p.v[k]);
      lm = fmaxf(lm, xs[k]);
    }
    const float nm = fmaxf(m, lm);
    const float ref = safe_ref(nm);
    float acc = s * expf(m - ref);
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc += expf(xs[k] - ref);
    s = acc;
    m = nm;
  }
  for (int64_t k = tid; k < parts.nscalar; k += nthreads) merge(m, s, to_float(x[parts.scalar_index(k)]), 1.f);
  block_merge(m, s);

  if (tid == 0) {
    const int32_t t = targets[row];
    const int64_t local = int64_t(t) - vocab_offset;
    float tv = 0.f;
    if (t >= vocab_size)
      tv = nan_f();
    else if (t >= 0 && local >= 0 && local < valid)
      tv = to_float(x[local]);
    stats[3 * row + 0] = m;
    stats[3 * row + 1] = s;
    stats[3 * row + 2] = tv;
  }
}

template <typename Tin, typename Tout>
__global__ void __launch_bounds__(1024)
    vocab_parallel_kernel(float* losses, Tout* dlogits, const Tin* logits, const int32_t* targets,
                          const float* all_stats, int64_t N, int64_t P, int64_t Vl, int64_t valid,
                          int64_t vocab_offset, float grad_scale) {
  constexpr int VEC = kVec<Tin>;
  const int64_t row = blockIdx.x;
  const Tin* x = logits + row * Vl;
  Tout* dx = dlogits == nullptr ? nullptr : dlogits + row * Vl;
  const int32_t t = targets[row];
  const int tid = threadIdx.x;
  const int nthreads = blockDim.x;
  const RowParts<Tin> parts(x, Vl);
  constexpr uintptr_t kOutAlign = alignof(Pack<Tout, VEC>);
  const bool packed_out =
      dx != nullptr && (reinterpret_cast<uintptr_t>(dx + parts.head) & (kOutAlign - 1)) == 0;

  if (t < 0) {  // ignored: uniform per block, no barrier passed yet
    if (tid == 0) losses[row] = 0.f;
    if (dx == nullptr) return;
    float d[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) d[k] = 0.f;
    for (int64_t i = tid; i < parts.nvec; i += nthreads)
      store_vec<Tout, VEC>(dx + parts.head + i * VEC, d, packed_out);
    for (int64_t k = tid; k < parts.nscalar; k += nthreads) dx[parts.scalar_index(k)] = from_float<Tout>(0.f);
    return;
  }

  // The row's factors for the gradient pass: exp(x - ref) * inv, and the
  // target column's value.
  TRAINER_SHARED(float, sh_ref);
  TRAINER_SHARED(float, sh_inv);
  TRAINER_SHARED(float, sh_dt);
  if (tid == 0) {
    double M = -INFINITY;
    for (int64_t p = 0; p < P; ++p) M = fmax(M, double(all_stats[(p * N + row) * 3]));
    double sum = 0, tl = 0;
    for (int64_t p = 0; p < P; ++p) {
      const float* sp = all_stats + (p * N + row) * 3;
      // A rank without probability mass (m = -inf, s = 0) is left out:
      // exp(-inf - M) is NaN when M is -inf too.
      if (sp[1] != 0.f) sum += double(sp[1]) * exp(double(sp[0]) - M);
      tl += double(sp[2]);
    }
    // No mass anywhere (every logit -inf) or a NaN target logit (a target
    // outside the vocabulary): NaN loss and gradient row, as in the fused op.
    const bool ok = sum > 0 && !isnan(tl);
    const double lse = ok ? M + log(sum) : double(nan_f());
    losses[row] = float(lse - tl);
    // M is one of the fp32 maxima, so float(M) is exact and x - ref is the
    // fp32 difference the fused kernel takes too.
    sh_ref = float(M);
    sh_inv = ok ? float(double(grad_scale) / sum) : nan_f();
    // In double: p_t - 1 keeps its digits when the model is confident.
    sh_dt = float((exp(tl - lse) - 1.0) * double(grad_scale));
  }
  if (dx == nullptr) return;  // uniform per block
  __syncthreads();
  const float ref = sh_ref, inv = sh_inv, dt = sh_dt;
  const int64_t local = int64_t(t) - vocab_offset;  // the target column, if in [0, valid)
  auto grad = [&](int64_t j, float xj) {
    if (j >= valid) return 0.f;
    return j == local ? dt : expf(xj - ref) * inv;
  };
  for (int64_t i = tid; i < parts.nvec; i += nthreads) {
    const int64_t j0 = parts.head + i * VEC;
    const Pack<Tin, VEC> p = *reinterpret_cast<const Pack<Tin, VEC>*>(x + j0);
    float d[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) d[k] = grad(j0 + k, to_float(p.v[k]));
    store_vec<Tout, VEC>(dx + j0, d, packed_out);
  }
  for (int64_t k = tid; k < parts.nscalar; k += nthreads) {
    const int64_t j = parts.scalar_index(k);
    dx[j] = from_float<Tout>(grad(j, to_float(x[j])));
  }
}

void check_rows(const char* op, int64_t N) {
  if (N > int64_t(std::numeric_limits<int>::max()))
    checks::fail(op, "too many rows for one block per row: " + std::to_string(N));
}

}  // namespace

void cross_entropy_forward_backward(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                    float grad_scale) {
  // Shapes, dtypes and overlaps arrive checked by the router
  // (kernels/checks/cross_entropy.cpp); one block per row needs N in an int.
  const int64_t V = logits.dim(-1);
  const int64_t N = V > 0 ? logits.numel() / V : 0;
  const bool has_d = !dlogits.empty();
  if (N == 0) return;
  if (N > int64_t(std::numeric_limits<int>::max())) fail("too many rows: " + std::to_string(N));

  const std::string ctx = "logits " + logits.shape_str() + " " + dtype_name(logits.dtype) +
                          (has_d ? std::string(", dlogits ") + dtype_name(dlogits.dtype) : std::string());
  const DType out_dtype = has_d ? dlogits.dtype : logits.dtype;
  DISPATCH_FLOAT(logits.dtype, Tin, kOp, {
    DISPATCH_FLOAT(out_dtype, Tout, kOp, {
      const int threads = threads_for(V, kVec<Tin>);
      launch(cross_entropy_kernel<Tin, Tout>, unsigned(N), threads, 0, stream(), losses.f32(),
             has_d ? static_cast<Tout*>(dlogits.data) : nullptr, static_cast<const Tin*>(logits.data), targets.i32(), V,
             grad_scale);
      KERNEL_CHECK("cross_entropy_kernel", ctx);
    });
  });
}

void cross_entropy_partial_stats(Tensor stats, Tensor logits, Tensor targets, int64_t vocab_offset,
                                 int64_t valid_cols, int64_t vocab_size) {
  // Shapes, dtypes and overlaps arrive checked by the router
  // (kernels/checks/cross_entropy.cpp).
  const char* op = "cross_entropy_partial_stats";
  const int64_t N = targets.numel(), Vl = logits.dim(-1);
  if (N == 0) return;
  check_rows(op, N);
  const std::string ctx = "logits " + logits.shape_str() + " " + dtype_name(logits.dtype) +
                          ", valid_cols " + std::to_string(valid_cols);
  DISPATCH_FLOAT(logits.dtype, Tin, op, {
    const int threads = threads_for(valid_cols, kVec<Tin>);
    launch(partial_stats_kernel<Tin>, unsigned(N), threads, 0, stream(), stats.f32(),
           static_cast<const Tin*>(logits.data), targets.i32(), Vl, valid_cols, vocab_offset, vocab_size);
    KERNEL_CHECK("partial_stats_kernel", ctx);
  });
}

void cross_entropy_vocab_parallel(Tensor losses, Tensor dlogits, Tensor logits, Tensor targets,
                                  Tensor all_stats, int64_t vocab_offset, int64_t valid_cols,
                                  float grad_scale) {
  // Shapes, dtypes and overlaps arrive checked by the router
  // (kernels/checks/cross_entropy.cpp).
  const char* op = "cross_entropy_vocab_parallel";
  const int64_t N = targets.numel(), Vl = logits.dim(-1), P = all_stats.dim(0);
  const bool has_d = !dlogits.empty();
  if (N == 0) return;
  check_rows(op, N);
  const std::string ctx = "logits " + logits.shape_str() + " " + dtype_name(logits.dtype) +
                          (has_d ? std::string(", dlogits ") + dtype_name(dlogits.dtype) : std::string()) +
                          ", all_stats " + all_stats.shape_str();
  const DType out_dtype = has_d ? dlogits.dtype : logits.dtype;
  DISPATCH_FLOAT(logits.dtype, Tin, op, {
    DISPATCH_FLOAT(out_dtype, Tout, op, {
      // Without dlogits only thread 0 works: one warp is enough.
      const int threads = has_d ? threads_for(Vl, kVec<Tin>) : 32;
      launch(vocab_parallel_kernel<Tin, Tout>, unsigned(N), threads, 0, stream(), losses.f32(),
             has_d ? static_cast<Tout*>(dlogits.data) : nullptr, static_cast<const Tin*>(logits.data), targets.i32(),
             all_stats.f32(), N, P, Vl, valid_cols, vocab_offset, grad_scale);
      KERNEL_CHECK("vocab_parallel_kernel", ctx);
    });
  });
}

}  // namespace trainer::cuda
