// Attention at explicit token positions and the merge of partial attentions,
// CUDA backend; semantics in kernels/op_list.h (attention_forward_pos,
// attention_merge, attention_backward_pos): the pieces of ring attention.
// q [B,Tq,Hq,D], k,v [B,Tk,Hkv,D], query head h reads kv head h / (Hq/Hkv),
// key j visible to query i iff k_pos[j] <= q_pos[i] (and, with a window
// W > 0, q_pos[i] - k_pos[j] <= W), scale 1/sqrt(D), lse [B,Hq,Tq] F32.
//
// Kernels: fp32 arithmetic in shared memory, as attention.cu's simple path
// (correct, not fast: no tensor cores), with the causal mask replaced by the
// positions. 256 threads, tiles of 32 query rows x 32 keys; K rows padded to
// D + 1 floats so the 32 lanes of a warp reading 32 keys hit 32 banks.
//   forward   one block per (32-row Q tile, q head, b), looping over the K/V
//             tiles with an online softmax; the rows' (max, sum) in smem.
//   backward  (1) delta[b,h,t] = dout . out (fp32 scratch, grow-only);
//             (2) dK/dV: one block per (32-key tile, kv head, b), looping over
//                 the query heads of its GQA group and every Q tile;
//             (3) dQ: one block per (Q tile, q head, b), looping over K tiles.
//             Each output element is owned by one thread, which adds its sum
//             to the stored value once (dq, dk, dv +=): no atomics, the same
//             bits run to run.
// A (Q tile, K tile) pair is skipped whole, before K/V (or Q/dO) are loaded,
// when the smallest key position of the K tile exceeds the largest query
// position of the Q tile, or (window) the largest key position lies more than
// W before the smallest query position: no query of the tile sees any of
// those keys. In a zigzag ring that is most of the work of the steps whose
// block lies after a rank's first chunk; with a window, of the pairs far
// apart. Inside a tile, a score is masked when its key is past Tk, its row
// past Tq, k_pos > q_pos or q_pos - k_pos > W; backward also masks rows whose
// final lse is -inf (they saw no key in any block, and add nothing).
//
// A row that sees no key: out = 0, lse = -inf (the sum stays 0).
//
// Smem (floats): forward (3*32*(D+1) + 32*33 + 3*32) + 64 ints = 29 / 54 KiB
// (D = 64 / 128); dK/dV (4*32*(D+1) + 2*32*33 + 2*32) + 64 ints = 42 / 75 KiB;
// dQ (4*32*(D+1) + 32*33 + 2*32) + 64 ints = 38 / 71 KiB; above 48 KiB the
// kernel is opted in once. Head dims 64 and 128 (as attention_forward).
//
// attention_merge: one warp per (b, t, h) row: the new lse and the two
// weights in fp32 (logaddexp as max + log1p(exp(min - max))), then the D
// elements of out; a side whose weight is 0 (lse -inf) is not read into the
// sum, so merging into the ring's start (out = 0, lse = -inf) copies the part.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"

namespace trainer::cuda {
namespace {

constexpr int kPThreads = 256;  // 8 warps
constexpr int kPR = 32;         // query rows per tile
constexpr int kPC = 32;         // keys per tile
constexpr size_t kPosMaxSmem = 99 * 1024;

template <int D> constexpr size_t pos_fwd_smem() {
  return (size_t(kPR + 2 * kPC) * (D + 1) + size_t(kPR) * (kPC + 1) + 3 * kPR) * sizeof(float) +
         size_t(kPR + kPC) * sizeof(int);
}
template <int D> constexpr size_t pos_dkdv_smem() {
  return (size_t(2 * kPR + 2 * kPC) * (D + 1) + size_t(2 * kPR) * (kPC + 1) + 2 * kPR) *
             sizeof(float) +
         size_t(kPR + kPC) * sizeof(int);
}
template <int D> constexpr size_t pos_dq_smem() {
  return (size_t(2 * kPR + 2 * kPC) * (D + 1) + size_t(kPR) * (kPC + 1) + 2 * kPR) *
             sizeof(float) +
         size_t(kPR + kPC) * sizeof(int);
}
static_assert(pos_fwd_smem<128>() <= kPosMaxSmem && pos_dkdv_smem<128>() <= kPosMaxSmem &&
                  pos_dq_smem<128>() <= kPosMaxSmem,
              "attention_positions smem");
static_assert(kPR == 32 && kPC == 32, "one lane per row / key of a tile");

// 32 rows of D elements of T -> fp32 smem rows of D + 1; rows >= valid are 0.
template <typename T, int D>
__device__ __forceinline__ void load_tile_f32(float* s, const T* g, int64_t stride, int valid) {
  for (int e = threadIdx.x; e < 32 * D; e += kPThreads) {
    const int r = e / D, d = e % D;
    s[r * (D + 1) + d] = r < valid ? to_float(g[r * stride + d]) : 0.f;
  }
}

__device__ __forceinline__ float pwarp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float pwarp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
__device__ __forceinline__ int pwarp_max_int(int x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ int pwarp_min_int(int x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

template <int D>
__device__ __forceinline__ float pdot(const float* a, const float* b) {
  float acc = 0.f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

// Key position kp lies before the window of query position qp (window 0: none).
__device__ __forceinline__ bool outside_window(int qp, int kp, int window) {
  return window > 0 && int64_t(qp) - kp > window;
}

// The smallest query position / largest key position of a tile's valid
// entries (what a window compares); lane i holds entry i of the 32.
__device__ __forceinline__ int tile_min_pos(const int* s, int first, int n) {
  return pwarp_min_int(first + int(threadIdx.x & 31) < n ? s[threadIdx.x & 31] : INT_MAX);
}
__device__ __forceinline__ int tile_max_pos(const int* s, int first, int n) {
  return pwarp_max_int(first + int(threadIdx.x & 31) < n ? s[threadIdx.x & 31] : INT_MIN);
}

// Positions of tile rows/keys into smem; padding gets a sentinel that never
// raises the tile's largest query position (INT_MIN) nor lowers its smallest
// key position (INT_MAX). The masks test validity by index, not by sentinel.
__device__ __forceinline__ void load_positions(int* s, const int32_t* pos, int first, int n,
                                               int pad) {
  if (int(threadIdx.x) < 32) {
    const int i = first + int(threadIdx.x);
    s[threadIdx.x] = i < n ? pos[i] : pad;
  }
}

// ---- forward ----------------------------------------------------------------

template <typename T, int D>
__global__ void __launch_bounds__(kPThreads, 1)
    pos_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                   const T* __restrict__ k, const T* __restrict__ v,
                   const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos, int Tq,
                   int Tk, int Hq, int Hkv, float scale, int window) {
  constexpr int LDF = D + 1, LDS = kPC + 1, PER = kPR * D / kPThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* Qs = reinterpret_cast<float*>(smem_raw);  // [kPR][LDF]
  float* Ks = Qs + kPR * LDF;                       // [kPC][LDF]
  float* Vs = Ks + kPC * LDF;                       // [kPC][LDF]
  float* Ss = Vs + kPC * LDF;                       // [kPR][LDS] scores, then probabilities
  float* Ms = Ss + kPR * LDS;                       // [kPR] running max
  float* Ls = Ms + kPR;                             // [kPR] running sum
  float* As = Ls + kPR;                             // [kPR] rescale factor of this tile
  int* Qp = reinterpret_cast<int*>(As + kPR);       // [kPR] query positions
  int* Kp = Qp + kPR;                               // [kPC] key positions

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = int(blockIdx.x) * kPR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const T* kg = k + int64_t(b) * Tk * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * Tk * ldk + int64_t(kvh) * D;

  load_tile_f32<T, D>(Qs, q + (int64_t(b) * Tq + q0) * ldq + int64_t(h) * D, ldq, Tq - q0);
  load_positions(Qp, q_pos, q0, Tq, INT_MIN);
  if (tid < kPR) {
    Ms[tid] = -INFINITY;
    Ls[tid] = 0.f;
  }
  float o[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) o[i] = 0.f;
  __syncthreads();
  const int qmax = pwarp_max_int(Qp[lane]);  // every warp: the same value
  const int qmin = tile_min_pos(Qp, q0, Tq);

  const int n_kt = (Tk + kPC - 1) / kPC;
  for (int j = 0; j < n_kt; ++j) {
    const int k0 = j * kPC;
    __syncthreads();  // the previous tile (Ks, Vs, Ss, Kp) fully consumed
    load_positions(Kp, k_pos, k0, Tk, INT_MAX);
    __syncthreads();
    // Block-uniform: no query sees these keys (all later, or all too old).
    if (pwarp_min_int(Kp[lane]) > qmax || outside_window(qmin, tile_max_pos(Kp, k0, Tk), window)) continue;
    load_tile_f32<T, D>(Ks, kg + k0 * ldk, ldk, Tk - k0);
    load_tile_f32<T, D>(Vs, vg + k0 * ldk, ldk, Tk - k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPR / 8; ++i) {
      const int r = warp + 8 * i;
      float x = pdot<D>(Qs + r * LDF, Ks + lane * LDF) * scale;
      if (q0 + r >= Tq || k0 + lane >= Tk || Kp[lane] > Qp[r] || outside_window(Qp[r], Kp[lane], window))
        x = -INFINITY;
      Ss[r * LDS + lane] = x;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPR / 8; ++i) {
      const int r = warp * (kPR / 8) + i;
      const float x = Ss[r * LDS + lane];
      const float m_old = Ms[r];
      const float m_new = fmaxf(m_old, pwarp_max(x));
      const float ref = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: exp(-inf) = 0
      const float p = expf(x - ref);
      const float sum = pwarp_sum(p);
      Ss[r * LDS + lane] = p;
      __syncwarp();
      if (lane == 0) {
        const float alpha = expf(m_old - ref);
        Ms[r] = m_new;
        Ls[r] = Ls[r] * alpha + sum;
        As[r] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = tid + kPThreads * i, r = e / D, d = e % D;
      float acc = o[i] * As[r];
#pragma unroll 8
      for (int c = 0; c < kPC; ++c) acc = fmaf(Ss[r * LDS + c], Vs[c * LDF + d], acc);
      o[i] = acc;
    }
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = tid + kPThreads * i, r = e / D, d = e % D, row = q0 + r;
    if (row < Tq) {
      const float sum = Ls[r];
      out[(int64_t(b) * Tq + row) * ldq + int64_t(h) * D + d] =
          from_float<T>(sum > 0.f ? o[i] / sum : 0.f);
    }
  }
  if (tid < kPR && q0 + tid < Tq)
    lse[(int64_t(b) * Hq + h) * Tq + q0 + tid] = Ls[tid] > 0.f ? Ms[tid] + logf(Ls[tid]) : -INFINITY;
}

// ---- merge --------------------------------------------------------------------

constexpr int kMergeWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kMergeWarps * 32)
    merge_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ part_out,
                 const float* __restrict__ part_lse, int64_t rows, int64_t T_len, int64_t H,
                 int64_t D) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kMergeWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together
  const int64_t h = row % H, bt = row / H, t = bt % T_len, b = bt / T_len;
  const int64_t li = (b * H + h) * T_len + t;
  const float l1 = lse[li], l2 = part_lse[li];
  float merged, w1, w2;
  if (isnan(l1) || isnan(l2)) {
    merged = w1 = w2 = NAN;
  } else {
    const float m = fmaxf(l1, l2);
    if (m == -INFINITY) {  // neither side has seen a key: out = 0
      merged = -INFINITY;
      w1 = w2 = 0.f;
    } else {
      merged = m + log1pf(expf(fminf(l1, l2) - m));
      w1 = expf(l1 - merged);
      w2 = expf(l2 - merged);
    }
  }
  T* x = out + row * D;
  const T* y = part_out + row * D;
  for (int64_t d = lane; d < D; d += 32) {
    const float a = w1 == 0.f ? 0.f : w1 * to_float(x[d]);
    const float c = w2 == 0.f ? 0.f : w2 * to_float(y[d]);
    x[d] = from_float<T>(a + c);
  }
  __syncwarp();  // every lane has read lse[li] before it is replaced
  if (lane == 0) lse[li] = merged;
}

// ---- backward: delta = rowsum(dout * out) --------------------------------------

constexpr int kDeltaWarps = 8;

template <typename T>
__global__ void __launch_bounds__(kDeltaWarps * 32)
    pos_delta_kernel(float* __restrict__ delta, const T* __restrict__ out,
                     const T* __restrict__ dout, int64_t rows, int64_t T_len, int64_t Hq, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kDeltaWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const T* o = out + row * D;
  const T* go = dout + row * D;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += to_float(o[d]) * to_float(go[d]);
  acc = pwarp_sum(acc);
  if (lane == 0) {
    const int64_t h = row % Hq, bt = row / Hq, t = bt % T_len, b = bt / T_len;
    delta[(b * Hq + h) * T_len + t] = acc;
  }
}

// ---- backward: dK, dV ------------------------------------------------------------

template <typename T, int D>
__global__ void __launch_bounds__(kPThreads, 1)
    pos_bwd_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                        const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ delta, const int32_t* __restrict__ q_pos,
                        const int32_t* __restrict__ k_pos, int Tq, int Tk, int Hq, int Hkv,
                        float scale, int window) {
  constexpr int LDF = D + 1, LDS = kPC + 1, PER = kPC * D / kPThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* Ks = reinterpret_cast<float*>(smem_raw);  // [kPC][LDF]
  float* Vs = Ks + kPC * LDF;                       // [kPC][LDF]
  float* Qs = Vs + kPC * LDF;                       // [kPR][LDF]
  float* dOs = Qs + kPR * LDF;                      // [kPR][LDF]
  float* Ps = dOs + kPR * LDF;                      // [kPR][LDS]
  float* dSs = Ps + kPR * LDS;                      // [kPR][LDS]
  float* Lr = dSs + kPR * LDS;                      // [kPR] lse (-inf: row adds nothing)
  float* Dr = Lr + kPR;                             // [kPR] delta
  int* Qp = reinterpret_cast<int*>(Dr + kPR);       // [kPR]
  int* Kp = Qp + kPR;                               // [kPC]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k0 = int(blockIdx.x) * kPC, kvh = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t kv_off = (int64_t(b) * Tk + k0) * ldk + int64_t(kvh) * D;
  load_tile_f32<T, D>(Ks, k + kv_off, ldk, Tk - k0);
  load_tile_f32<T, D>(Vs, v + kv_off, ldk, Tk - k0);
  load_positions(Kp, k_pos, k0, Tk, INT_MAX);
  __syncthreads();
  const int kmin = pwarp_min_int(Kp[lane]), kmax = tile_max_pos(Kp, k0, Tk);

  float dka[PER], dva[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) dka[i] = dva[i] = 0.f;

  const int n_qt = (Tq + kPR - 1) / kPR;
  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    for (int qt = 0; qt < n_qt; ++qt) {
      const int q0 = qt * kPR;
      __syncthreads();  // the previous Q tile (Qs, dOs, Ps, dSs, Lr, Dr, Qp) fully consumed
      load_positions(Qp, q_pos, q0, Tq, INT_MIN);
      if (tid < kPR) {
        const int row = q0 + tid;
        const int64_t idx = (int64_t(b) * Hq + h) * Tq + row;
        Lr[tid] = row < Tq ? lse[idx] : -INFINITY;
        Dr[tid] = row < Tq ? delta[idx] : 0.f;
      }
      __syncthreads();
      // Block-uniform: nobody here sees these keys (all later, or all too old).
      if (kmin > pwarp_max_int(Qp[lane]) || outside_window(tile_min_pos(Qp, q0, Tq), kmax, window)) continue;
      const int64_t q_off = (int64_t(b) * Tq + q0) * ldq + int64_t(h) * D;
      load_tile_f32<T, D>(Qs, q + q_off, ldq, Tq - q0);
      load_tile_f32<T, D>(dOs, dout + q_off, ldq, Tq - q0);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kPR / 8; ++i) {
        const int r = warp + 8 * i, c = lane;
        const float sc = pdot<D>(Qs + r * LDF, Ks + c * LDF);
        const float gp = pdot<D>(dOs + r * LDF, Vs + c * LDF);
        const bool masked = q0 + r >= Tq || k0 + c >= Tk || Kp[c] > Qp[r] ||
                            outside_window(Qp[r], Kp[c], window) || Lr[r] == -INFINITY;
        const float p = masked ? 0.f : expf(sc * scale - Lr[r]);
        Ps[r * LDS + c] = p;
        dSs[r * LDS + c] = masked ? 0.f : p * (gp - Dr[r]);
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int e = tid + kPThreads * i, c = e / D, d = e % D;
        float a = dva[i], bacc = dka[i];
#pragma unroll 8
        for (int r = 0; r < kPR; ++r) {
          a = fmaf(Ps[r * LDS + c], dOs[r * LDF + d], a);
          bacc = fmaf(dSs[r * LDS + c], Qs[r * LDF + d], bacc);
        }
        dva[i] = a;
        dka[i] = bacc;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = tid + kPThreads * i, c = e / D, d = e % D, key = k0 + c;
    if (key < Tk) {
      const int64_t idx = (int64_t(b) * Tk + key) * ldk + int64_t(kvh) * D + d;
      dk[idx] = from_float<T>(to_float(dk[idx]) + dka[i] * scale);
      dv[idx] = from_float<T>(to_float(dv[idx]) + dva[i]);
    }
  }
}

// ---- backward: dQ ---------------------------------------------------------------

template <typename T, int D>
__global__ void __launch_bounds__(kPThreads, 1)
    pos_bwd_dq_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                      const T* __restrict__ v, const T* __restrict__ dout,
                      const float* __restrict__ lse, const float* __restrict__ delta,
                      const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos, int Tq,
                      int Tk, int Hq, int Hkv, float scale, int window) {
  constexpr int LDF = D + 1, LDS = kPC + 1, PER = kPR * D / kPThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* Qs = reinterpret_cast<float*>(smem_raw);  // [kPR][LDF]
  float* dOs = Qs + kPR * LDF;                      // [kPR][LDF]
  float* Ks = dOs + kPR * LDF;                      // [kPC][LDF]
  float* Vs = Ks + kPC * LDF;                       // [kPC][LDF]
  float* dSs = Vs + kPC * LDF;                      // [kPR][LDS]
  float* Lr = dSs + kPR * LDS;                      // [kPR]
  float* Dr = Lr + kPR;                             // [kPR]
  int* Qp = reinterpret_cast<int*>(Dr + kPR);       // [kPR]
  int* Kp = Qp + kPR;                               // [kPC]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = int(blockIdx.x) * kPR;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t q_off = (int64_t(b) * Tq + q0) * ldq + int64_t(h) * D;
  const T* kg = k + int64_t(b) * Tk * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * Tk * ldk + int64_t(kvh) * D;

  load_tile_f32<T, D>(Qs, q + q_off, ldq, Tq - q0);
  load_tile_f32<T, D>(dOs, dout + q_off, ldq, Tq - q0);
  load_positions(Qp, q_pos, q0, Tq, INT_MIN);
  if (tid < kPR) {
    const int row = q0 + tid;
    const int64_t idx = (int64_t(b) * Hq + h) * Tq + row;
    Lr[tid] = row < Tq ? lse[idx] : -INFINITY;
    Dr[tid] = row < Tq ? delta[idx] : 0.f;
  }
  float dqa[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) dqa[i] = 0.f;
  __syncthreads();
  const int qmax = pwarp_max_int(Qp[lane]);
  const int qmin = tile_min_pos(Qp, q0, Tq);

  const int n_kt = (Tk + kPC - 1) / kPC;
  for (int j = 0; j < n_kt; ++j) {
    const int k0 = j * kPC;
    __syncthreads();  // the previous tile (Ks, Vs, dSs, Kp) fully consumed
    load_positions(Kp, k_pos, k0, Tk, INT_MAX);
    __syncthreads();
    if (pwarp_min_int(Kp[lane]) > qmax || outside_window(qmin, tile_max_pos(Kp, k0, Tk), window))
      continue;  // block-uniform
    load_tile_f32<T, D>(Ks, kg + k0 * ldk, ldk, Tk - k0);
    load_tile_f32<T, D>(Vs, vg + k0 * ldk, ldk, Tk - k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kPR / 8; ++i) {
      const int r = warp + 8 * i, c = lane;
      const float sc = pdot<D>(Qs + r * LDF, Ks + c * LDF);
      const float gp = pdot<D>(dOs + r * LDF, Vs + c * LDF);
      const bool masked = q0 + r >= Tq || k0 + c >= Tk || Kp[c] > Qp[r] ||
                          outside_window(Qp[r], Kp[c], window) || Lr[r] == -INFINITY;
      const float p = masked ? 0.f : expf(sc * scale - Lr[r]);
      dSs[r * LDS + c] = masked ? 0.f : p * (gp - Dr[r]);
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = tid + kPThreads * i, r = e / D, d = e % D;
      float acc = dqa[i];
#pragma unroll 8
      for (int c = 0; c < kPC; ++c) acc = fmaf(dSs[r * LDS + c], Ks[c * LDF + d], acc);
      dqa[i] = acc;
    }
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int e = tid + kPThreads * i, r = e / D, d = e % D, row = q0 + r;
    if (row < Tq) {
      const int64_t idx = (int64_t(b) * Tq + row) * ldq + int64_t(h) * D + d;
      dq[idx] = from_float<T>(to_float(dq[idx]) + dqa[i] * scale);
    }
  }
}

// ============================================================================
// Host side
// ============================================================================

struct Dims {
  int64_t B, Tq, Tk, Hq, Hkv, D;
};

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// Shapes arrive checked by the router (kernels/checks/attention_positions.cpp).
// CUDA's own: one storage type for every float tensor of a call, the head
// dims the kernels are built for, grid and index limits.
void same_dtype(const char* op, const char* name, const Tensor& t, const char* like_name,
                const Tensor& like) {
  if (t.dtype != like.dtype)
    fail(op, std::string(name) + " " + t.shape_str() + " is " + dtype_name(t.dtype) +
                 ", expected " + dtype_name(like.dtype) + " like " + like_name);
}

Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  same_dtype(op, "k", k, "q", q);
  same_dtype(op, "v", v, "q", q);
  const Dims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  if (d.D != 64 && d.D != 128)
    fail(op, "head dim D=" + std::to_string(d.D) + " is not supported on CUDA (64 or 128)");
  if (d.Tq > INT_MAX / 2 || d.Tk > INT_MAX / 2 || d.Hq > 65535 || d.B > 65535)
    fail(op, "q " + q.shape_str() + " k " + k.shape_str() +
                 " are too large (Tq, Tk < 2^30, Hq and B <= 65535)");
  return d;
}

std::string context(const Tensor& q, const Tensor& k, int64_t window) {
  return "q " + q.shape_str() + " k " + k.shape_str() + " " + dtype_name(q.dtype) +
         " at positions" + (window > 0 ? " window " + std::to_string(window) : "");
}

// The kernels' window: 0 none; positions are int32, so any window past
// INT_MAX is as good as none.
int kernel_window(int64_t window) { return window > 0 && window < INT_MAX ? int(window) : 0; }

template <typename Kernel>
bool allow_smem(Kernel kernel, size_t bytes, const char* name) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(bytes)),
               std::string(name) + " (" + std::to_string(bytes) + " bytes of shared memory)");
  return true;
}

// delta [B, Hq, Tq] F32 for the backward. Grow-only (reallocated only for a
// larger shape, after draining the stream: a queued kernel may still read
// the old buffer); outside the arenas, B*Hq*Tq*4 bytes. One device per process.
float* pos_delta_scratch(size_t n) {
  static std::mutex mu;
  static float* buf = nullptr;
  static size_t cap = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (n > cap) {
    if (buf != nullptr) {
      CUDA_CHECK(cudaStreamSynchronize(stream()), "attention_backward_pos delta scratch: growing");
      CUDA_CHECK(cudaFree(buf), "attention_backward_pos delta scratch");
      buf = nullptr;
      cap = 0;
    }
    CUDA_CHECK(cudaMalloc(&buf, n * sizeof(float)),
               "attention_backward_pos delta scratch: " + std::to_string(n) + " floats");
    cap = n;
  }
  return buf;
}

float softmax_scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }

template <typename T, int D>
void forward_launch(const Dims& d, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                    Tensor q_pos, Tensor k_pos, int window, const std::string& ctx) {
  constexpr size_t smem = pos_fwd_smem<D>();
  static const bool ready = allow_smem(pos_fwd_kernel<T, D>, smem, "pos_fwd_kernel");
  (void)ready;
  const dim3 grid(unsigned((d.Tq + kPR - 1) / kPR), unsigned(d.Hq), unsigned(d.B));
  pos_fwd_kernel<T, D><<<grid, kPThreads, smem, stream()>>>(
      static_cast<T*>(out.data), static_cast<float*>(lse.data), static_cast<const T*>(q.data),
      static_cast<const T*>(k.data), static_cast<const T*>(v.data),
      static_cast<const int32_t*>(q_pos.data), static_cast<const int32_t*>(k_pos.data), int(d.Tq),
      int(d.Tk), int(d.Hq), int(d.Hkv), softmax_scale(D), window);
  KERNEL_CHECK("pos_fwd_kernel", ctx);
}

template <typename T, int D>
void backward_launch(const Dims& d, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                     Tensor k, Tensor v, Tensor lse, const float* delta, Tensor q_pos,
                     Tensor k_pos, int window, const std::string& ctx) {
  const float scale = softmax_scale(D);
  const auto* qp = static_cast<const int32_t*>(q_pos.data);
  const auto* kp = static_cast<const int32_t*>(k_pos.data);
  {
    constexpr size_t smem = pos_dkdv_smem<D>();
    static const bool ready = allow_smem(pos_bwd_dkdv_kernel<T, D>, smem, "pos_bwd_dkdv_kernel");
    (void)ready;
    const dim3 grid(unsigned((d.Tk + kPC - 1) / kPC), unsigned(d.Hkv), unsigned(d.B));
    pos_bwd_dkdv_kernel<T, D><<<grid, kPThreads, smem, stream()>>>(
        static_cast<T*>(dk.data), static_cast<T*>(dv.data), static_cast<const T*>(q.data),
        static_cast<const T*>(k.data), static_cast<const T*>(v.data),
        static_cast<const T*>(dout.data), static_cast<const float*>(lse.data), delta, qp, kp,
        int(d.Tq), int(d.Tk), int(d.Hq), int(d.Hkv), scale, window);
    KERNEL_CHECK("pos_bwd_dkdv_kernel", ctx);
  }
  {
    constexpr size_t smem = pos_dq_smem<D>();
    static const bool ready = allow_smem(pos_bwd_dq_kernel<T, D>, smem, "pos_bwd_dq_kernel");
    (void)ready;
    const dim3 grid(unsigned((d.Tq + kPR - 1) / kPR), unsigned(d.Hq), unsigned(d.B));
    pos_bwd_dq_kernel<T, D><<<grid, kPThreads, smem, stream()>>>(
        static_cast<T*>(dq.data), static_cast<const T*>(q.data), static_cast<const T*>(k.data),
        static_cast<const T*>(v.data), static_cast<const T*>(dout.data),
        static_cast<const float*>(lse.data), delta, qp, kp, int(d.Tq), int(d.Tk), int(d.Hq),
        int(d.Hkv), scale, window);
    KERNEL_CHECK("pos_bwd_dq_kernel", ctx);
  }
}

}  // namespace

void attention_forward_pos(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor q_pos,
                           Tensor k_pos, int64_t window) {
  const char* op = "attention_forward_pos";
  const Dims d = check_qkv(op, q, k, v);
  same_dtype(op, "out", out, "q", q);
  if (d.B == 0 || d.Tq == 0 || d.Hq == 0) return;
  // Tk = 0 runs too: no tile, every row out = 0, lse = -inf.
  const std::string ctx = context(q, k, window);
  const int win = kernel_window(window);
  DISPATCH_FLOAT(q.dtype, T, op, {
    if (d.D == 64)
      forward_launch<T, 64>(d, out, lse, q, k, v, q_pos, k_pos, win, ctx);
    else
      forward_launch<T, 128>(d, out, lse, q, k, v, q_pos, k_pos, win, ctx);
  });
}

void attention_merge(Tensor out, Tensor lse, Tensor part_out, Tensor part_lse) {
  const char* op = "attention_merge";
  same_dtype(op, "part_out", part_out, "out", out);
  const int64_t B = out.dim(0), T_len = out.dim(1), H = out.dim(2), D = out.dim(3);
  const int64_t rows = B * T_len * H;
  if (rows == 0 || D == 0) return;
  const int64_t blocks = (rows + kMergeWarps - 1) / kMergeWarps;
  if (blocks > INT_MAX) fail(op, "out " + out.shape_str() + " has too many rows for one launch");
  const std::string ctx = "out " + out.shape_str() + " " + dtype_name(out.dtype);
  DISPATCH_FLOAT(out.dtype, T, op, {
    merge_kernel<T><<<unsigned(blocks), kMergeWarps * 32, 0, stream()>>>(
        static_cast<T*>(out.data), static_cast<float*>(lse.data),
        static_cast<const T*>(part_out.data), static_cast<const float*>(part_lse.data), rows,
        T_len, H, D);
    KERNEL_CHECK("merge_kernel", ctx);
  });
}

void attention_backward_pos(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                            Tensor v, Tensor out, Tensor lse, Tensor q_pos, Tensor k_pos,
                            int64_t window) {
  const char* op = "attention_backward_pos";
  const Dims d = check_qkv(op, q, k, v);
  same_dtype(op, "out", out, "q", q);
  same_dtype(op, "dout", dout, "q", q);
  same_dtype(op, "dq", dq, "q", q);
  same_dtype(op, "dk", dk, "k", k);
  same_dtype(op, "dv", dv, "v", v);
  if (d.B == 0 || d.Tq == 0 || d.Tk == 0 || d.Hq == 0) return;
  const std::string ctx = context(q, k, window);
  const int win = kernel_window(window);
  const int64_t rows = d.B * d.Tq * d.Hq;
  float* delta = pos_delta_scratch(size_t(rows));
  DISPATCH_FLOAT(q.dtype, T, op, {
    pos_delta_kernel<T><<<unsigned((rows + kDeltaWarps - 1) / kDeltaWarps), kDeltaWarps * 32, 0,
                          stream()>>>(delta, static_cast<const T*>(out.data),
                                      static_cast<const T*>(dout.data), rows, d.Tq, d.Hq,
                                      int(d.D));
    KERNEL_CHECK("pos_delta_kernel", ctx);
    if (d.D == 64)
      backward_launch<T, 64>(d, dq, dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, win, ctx);
    else
      backward_launch<T, 128>(d, dq, dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, win, ctx);
  });
}

}  // namespace trainer::cuda
