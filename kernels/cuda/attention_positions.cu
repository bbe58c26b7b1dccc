// Attention at explicit token positions and the merge of partial attentions,
// CUDA backend; semantics in kernels/op_list.h (attention_forward_pos,
// attention_merge, attention_backward_pos): the pieces of ring attention.
// q [B,Tq,Hq,D], k,v [B,Tk,Hkv,D], query head h reads kv head h / (Hq/Hkv),
// key j visible to query i iff k_pos[j] <= q_pos[i] (and, with a window
// W > 0, q_pos[i] - k_pos[j] <= W; with separate documents, k_pos[j] >=
// q_doc_start[b,i]), scale 1/sqrt(D), lse [B,Hq,Tq] F32. Window and
// document give each row a lowest visible key position (lowest_visible):
// key j is visible iff lowest_i <= k_pos[j] <= q_pos[i]. As in attention.cu,
// each kernel is built without documents (NAME_kernel: the window's tests
// alone, the code before documents) and with them (NAME_docs_kernel).
//
// Kernels: fp32 arithmetic in shared memory, built like attention.cu's
// simple path from attention_tiles.cuh (correct, not fast: no tensor cores),
// with the causal mask replaced by the positions. 256 threads, tiles of 32
// query rows x 32 keys; K rows padded to D + 1 floats so the 32 lanes of a
// warp reading 32 keys hit 32 banks.
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
// position of the Q tile, or the largest key position lies below every
// row's lowest visible one (window, document): no query of the tile sees any
// of those keys. In a zigzag ring that is most of the work of the steps whose
// block lies after a rank's first chunk; with a window, of the pairs far
// apart; with documents, of the blocks before a rank's rows' documents.
// Inside a tile, a score is masked when its key is past Tk, its row past Tq,
// k_pos > q_pos or k_pos below the row's lowest; backward also masks rows
// whose final lse is -inf (they saw no key in any block, and add nothing).
//
// A row that sees no key: out = 0, lse = -inf (the sum stays 0).
//
// Smem (floats): forward (3*32*(D+1) + 32*33 + 3*32) + 64 ints = 29 / 54 KiB
// (D = 64 / 128); dK/dV (4*32*(D+1) + 2*32*33 + 2*32) + 64 ints = 42 / 75 KiB;
// dQ (4*32*(D+1) + 32*33 + 2*32) + 64 ints = 38 / 71 KiB; above 48 KiB the
// kernel is opted in once. Head dims 32, 64 and 128 (as attention_forward).
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
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

using namespace attention_tiles;

__device__ __forceinline__ int warp_max_int(int x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ int warp_min_int(int x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = min(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}

// Key position kp lies before the window of query position qp (window 0: none).
__device__ __forceinline__ bool outside_window(int qp, int kp, int window) {
  return window > 0 && int64_t(qp) - kp > window;
}

// The lowest key position query position qp sees: its document's first
// position doc_first (INT_MIN without documents) and, with a window W > 0,
// qp - W (held in int32 like the positions: a bound below INT_MIN is none).
// Key position kp is visible iff lowest <= kp <= qp.
__device__ __forceinline__ int lowest_visible(int qp, int doc_first, int window) {
  if (window <= 0) return doc_first;
  const int64_t w = int64_t(qp) - window;
  return max(doc_first, w < INT_MIN ? INT_MIN : int(w));
}

// Lane i's query row q0 + i of the tile (Qp: its positions in smem, qd: the
// sequence's q_doc_start row or null): the row's lowest visible key
// position, INT_MAX for padding past Tq (it sees nothing). A warp holds the
// whole tile's, so its minimum bounds the tile and a shuffle gives any row's.
__device__ __forceinline__ int lane_row_lowest(const int* Qp, const int32_t* qd, int q0, int Tq,
                                               int window) {
  const int lane = int(threadIdx.x & 31), i = q0 + lane;
  return i < Tq ? lowest_visible(Qp[lane], qd != nullptr ? int(qd[i]) : INT_MIN, window) : INT_MAX;
}

// The smallest query position / largest key position of a tile's valid
// entries (what a window compares, and the rows' lowest bounds); lane i
// holds entry i of the 32.
__device__ __forceinline__ int tile_min_pos(const int* s, int first, int n) {
  return warp_min_int(first + int(threadIdx.x & 31) < n ? s[threadIdx.x & 31] : INT_MAX);
}
__device__ __forceinline__ int tile_max_pos(const int* s, int first, int n) {
  return warp_max_int(first + int(threadIdx.x & 31) < n ? s[threadIdx.x & 31] : INT_MIN);
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

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    pos_fwd(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
            const T* __restrict__ k, const T* __restrict__ v, const int32_t* __restrict__ q_pos,
            const int32_t* __restrict__ k_pos, const int32_t* __restrict__ q_doc, int Tq, int Tk,
            int Hq, int Hkv, float scale, int window) {
  constexpr int LDF = D + 1, LDS = kTileKeys + 1, PER = tile_per_thread<D>();
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  const FwdTileSmem<D> s(smem_raw);
  const int* Qp = s.Qp;
  const int* Kp = s.Kp;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = int(blockIdx.x) * kTileRows;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const T* kg = k + int64_t(b) * Tk * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * Tk * ldk + int64_t(kvh) * D;

  load_tile_f32<T, D>(s.Qs, q + (int64_t(b) * Tq + q0) * ldq + int64_t(h) * D, ldq, Tq - q0);
  load_positions(s.Qp, q_pos, q0, Tq, INT_MIN);
  if (tid < kTileRows) {
    s.Ms[tid] = -INFINITY;
    s.Ls[tid] = 0.f;
  }
  float o[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) o[i] = 0.f;
  __syncthreads();
  const int qmax = warp_max_int(Qp[lane]);  // every warp: the same value
  const int qmin = kDocs ? 0 : tile_min_pos(Qp, q0, Tq);
  // With documents, the rows' lowest visible key positions (window and
  // document): the tile's, and this thread's rows warp + 8 i.
  int qlo = INT_MIN, lo[kTileRows / 8];
  if (kDocs) {
    const int my_lo = lane_row_lowest(Qp, q_doc + int64_t(b) * Tq, q0, Tq, window);
    qlo = warp_min_int(my_lo);
#pragma unroll
    for (int i = 0; i < kTileRows / 8; ++i) lo[i] = __shfl_sync(0xffffffffu, my_lo, warp + 8 * i);
  }

  const int n_kt = (Tk + kTileKeys - 1) / kTileKeys;
  for (int j = 0; j < n_kt; ++j) {
    const int k0 = j * kTileKeys;
    __syncthreads();  // the previous tile (Ks, Vs, Ss, Kp) fully consumed
    load_positions(s.Kp, k_pos, k0, Tk, INT_MAX);
    __syncthreads();
    // Block-uniform: no query sees these keys (all later, or all before
    // every row's window and document).
    if (warp_min_int(Kp[lane]) > qmax ||
        (kDocs ? tile_max_pos(Kp, k0, Tk) < qlo
               : outside_window(qmin, tile_max_pos(Kp, k0, Tk), window)))
      continue;
    load_tile_f32<T, D>(s.Ks, kg + k0 * ldk, ldk, Tk - k0);
    load_tile_f32<T, D>(s.Vs, vg + k0 * ldk, ldk, Tk - k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTileRows / 8; ++i) {
      const int r = warp + 8 * i;
      float x = dot_rows<D>(s.Qs + r * LDF, s.Ks + lane * LDF) * scale;
      if (q0 + r >= Tq || k0 + lane >= Tk || Kp[lane] > Qp[r] ||
          (kDocs ? Kp[lane] < lo[i] : outside_window(Qp[r], Kp[lane], window)))
        x = -INFINITY;
      s.Ss[r * LDS + lane] = x;
    }
    __syncthreads();
    online_softmax_tile<D>(s);
    __syncthreads();
    accumulate_pv<D>(o, s);
  }
  __syncthreads();
  store_out_tile<T, D>(out, o, s.Ls, q0, Tq, b, h, ldq);
  if (tid < kTileRows && q0 + tid < Tq)
    lse[(int64_t(b) * Hq + h) * Tq + q0 + tid] = s.Ls[tid] > 0.f ? s.Ms[tid] + logf(s.Ls[tid]) : -INFINITY;
}

template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    pos_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                   const T* __restrict__ k, const T* __restrict__ v,
                   const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos,
                   const int32_t* __restrict__ q_doc, int Tq, int Tk, int Hq, int Hkv, float scale,
                   int window) {
  pos_fwd<T, D, false>(out, lse, q, k, v, q_pos, k_pos, q_doc, Tq, Tk, Hq, Hkv, scale, window);
}
template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    pos_fwd_docs_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                        const T* __restrict__ k, const T* __restrict__ v,
                        const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos,
                        const int32_t* __restrict__ q_doc, int Tq, int Tk, int Hq, int Hkv,
                        float scale, int window) {
  pos_fwd<T, D, true>(out, lse, q, k, v, q_pos, k_pos, q_doc, Tq, Tk, Hq, Hkv, scale, window);
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

// ---- backward: delta = rowsum(dout * out): attention_tiles.cuh ------------------

// ---- backward: dK, dV ------------------------------------------------------------

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    pos_bwd_dkdv(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                 const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                 const float* __restrict__ lse, const float* __restrict__ delta,
                 const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos,
                 const int32_t* __restrict__ q_doc, int Tq, int Tk, int Hq, int Hkv, float scale,
                 int window) {
  constexpr int LDF = D + 1, LDS = kTileKeys + 1, PER = tile_per_thread<D>();
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  const DkvTileSmem<D> s(smem_raw);  // Lr: lse (-inf: the row adds nothing)
  const int* Qp = s.Qp;
  const int* Kp = s.Kp;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int k0 = int(blockIdx.x) * kTileKeys, kvh = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t kv_off = (int64_t(b) * Tk + k0) * ldk + int64_t(kvh) * D;
  load_tile_f32<T, D>(s.Ks, k + kv_off, ldk, Tk - k0);
  load_tile_f32<T, D>(s.Vs, v + kv_off, ldk, Tk - k0);
  load_positions(s.Kp, k_pos, k0, Tk, INT_MAX);
  __syncthreads();
  const int kmin = warp_min_int(Kp[lane]), kmax = tile_max_pos(Kp, k0, Tk);
  const int32_t* qd = kDocs ? q_doc + int64_t(b) * Tq : nullptr;

  float dka[PER], dva[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) dka[i] = dva[i] = 0.f;

  const int n_qt = (Tq + kTileRows - 1) / kTileRows;
  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    for (int qt = 0; qt < n_qt; ++qt) {
      const int q0 = qt * kTileRows;
      __syncthreads();  // the previous Q tile (Qs, dOs, Ps, dSs, Lr, Dr, Qp) fully consumed
      load_positions(s.Qp, q_pos, q0, Tq, INT_MIN);
      load_row_stats(s.Lr, s.Dr, lse, delta, b, h, Hq, q0, Tq, -INFINITY);
      __syncthreads();
      // Block-uniform: nobody here sees these keys (all later, or all before
      // every row's window and document).
      const int my_lo = kDocs ? lane_row_lowest(Qp, qd, q0, Tq, window) : INT_MIN;
      if (kmin > warp_max_int(Qp[lane]) ||
          (kDocs ? kmax < warp_min_int(my_lo) : outside_window(tile_min_pos(Qp, q0, Tq), kmax, window)))
        continue;
      int lo[kTileRows / 8];
      if (kDocs) {
#pragma unroll
        for (int i = 0; i < kTileRows / 8; ++i) lo[i] = __shfl_sync(0xffffffffu, my_lo, warp + 8 * i);
      }
      const int64_t q_off = (int64_t(b) * Tq + q0) * ldq + int64_t(h) * D;
      load_tile_f32<T, D>(s.Qs, q + q_off, ldq, Tq - q0);
      load_tile_f32<T, D>(s.dOs, dout + q_off, ldq, Tq - q0);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kTileRows / 8; ++i) {
        const int r = warp + 8 * i, c = lane;
        const float sc = dot_rows<D>(s.Qs + r * LDF, s.Ks + c * LDF);
        const float gp = dot_rows<D>(s.dOs + r * LDF, s.Vs + c * LDF);
        const bool masked = q0 + r >= Tq || k0 + c >= Tk || Kp[c] > Qp[r] ||
                            (kDocs ? Kp[c] < lo[i] : outside_window(Qp[r], Kp[c], window)) ||
                            s.Lr[r] == -INFINITY;
        const float p = masked ? 0.f : expf(sc * scale - s.Lr[r]);
        s.Ps[r * LDS + c] = p;
        s.dSs[r * LDS + c] = masked ? 0.f : p * (gp - s.Dr[r]);
      }
      __syncthreads();
      accumulate_dkdv<D>(dka, dva, s);
    }
  }
  store_dkdv_tile<true, T, D>(dk, dv, dka, dva, k0, Tk, b, kvh, ldk, scale);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    pos_bwd_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                        const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ dout, const float* __restrict__ lse,
                        const float* __restrict__ delta, const int32_t* __restrict__ q_pos,
                        const int32_t* __restrict__ k_pos, const int32_t* __restrict__ q_doc,
                        int Tq, int Tk, int Hq, int Hkv, float scale, int window) {
  pos_bwd_dkdv<T, D, false>(dk, dv, q, k, v, dout, lse, delta, q_pos, k_pos, q_doc, Tq, Tk, Hq, Hkv,
                            scale, window);
}
template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    pos_bwd_dkdv_docs_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                             const T* __restrict__ k, const T* __restrict__ v,
                             const T* __restrict__ dout, const float* __restrict__ lse,
                             const float* __restrict__ delta, const int32_t* __restrict__ q_pos,
                             const int32_t* __restrict__ k_pos, const int32_t* __restrict__ q_doc,
                             int Tq, int Tk, int Hq, int Hkv, float scale, int window) {
  pos_bwd_dkdv<T, D, true>(dk, dv, q, k, v, dout, lse, delta, q_pos, k_pos, q_doc, Tq, Tk, Hq, Hkv,
                           scale, window);
}

// ---- backward: dQ ---------------------------------------------------------------

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    pos_bwd_dq(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
               const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ lse,
               const float* __restrict__ delta, const int32_t* __restrict__ q_pos,
               const int32_t* __restrict__ k_pos, const int32_t* __restrict__ q_doc, int Tq, int Tk,
               int Hq, int Hkv, float scale, int window) {
  constexpr int LDF = D + 1, LDS = kTileKeys + 1, PER = tile_per_thread<D>();
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  const DqTileSmem<D> s(smem_raw);
  const int* Qp = s.Qp;
  const int* Kp = s.Kp;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q0 = int(blockIdx.x) * kTileRows;
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t q_off = (int64_t(b) * Tq + q0) * ldq + int64_t(h) * D;
  const T* kg = k + int64_t(b) * Tk * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * Tk * ldk + int64_t(kvh) * D;

  load_tile_f32<T, D>(s.Qs, q + q_off, ldq, Tq - q0);
  load_tile_f32<T, D>(s.dOs, dout + q_off, ldq, Tq - q0);
  load_positions(s.Qp, q_pos, q0, Tq, INT_MIN);
  load_row_stats(s.Lr, s.Dr, lse, delta, b, h, Hq, q0, Tq, -INFINITY);
  float dqa[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) dqa[i] = 0.f;
  __syncthreads();
  const int qmax = warp_max_int(Qp[lane]);
  const int qmin = kDocs ? 0 : tile_min_pos(Qp, q0, Tq);
  int qlo = INT_MIN, lo[kTileRows / 8];  // as the forward
  if (kDocs) {
    const int my_lo = lane_row_lowest(Qp, q_doc + int64_t(b) * Tq, q0, Tq, window);
    qlo = warp_min_int(my_lo);
#pragma unroll
    for (int i = 0; i < kTileRows / 8; ++i) lo[i] = __shfl_sync(0xffffffffu, my_lo, warp + 8 * i);
  }

  const int n_kt = (Tk + kTileKeys - 1) / kTileKeys;
  for (int j = 0; j < n_kt; ++j) {
    const int k0 = j * kTileKeys;
    __syncthreads();  // the previous tile (Ks, Vs, dSs, Kp) fully consumed
    load_positions(s.Kp, k_pos, k0, Tk, INT_MAX);
    __syncthreads();
    if (warp_min_int(Kp[lane]) > qmax ||
        (kDocs ? tile_max_pos(Kp, k0, Tk) < qlo
               : outside_window(qmin, tile_max_pos(Kp, k0, Tk), window)))
      continue;  // block-uniform
    load_tile_f32<T, D>(s.Ks, kg + k0 * ldk, ldk, Tk - k0);
    load_tile_f32<T, D>(s.Vs, vg + k0 * ldk, ldk, Tk - k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTileRows / 8; ++i) {
      const int r = warp + 8 * i, c = lane;
      const float sc = dot_rows<D>(s.Qs + r * LDF, s.Ks + c * LDF);
      const float gp = dot_rows<D>(s.dOs + r * LDF, s.Vs + c * LDF);
      const bool masked = q0 + r >= Tq || k0 + c >= Tk || Kp[c] > Qp[r] ||
                          (kDocs ? Kp[c] < lo[i] : outside_window(Qp[r], Kp[c], window)) ||
                          s.Lr[r] == -INFINITY;
      const float p = masked ? 0.f : expf(sc * scale - s.Lr[r]);
      s.dSs[r * LDS + c] = masked ? 0.f : p * (gp - s.Dr[r]);
    }
    __syncthreads();
    accumulate_dq<D>(dqa, s);
  }
  store_dq_tile<true, T, D>(dq, dqa, q0, Tq, b, h, ldq, scale);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    pos_bwd_dq_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                      const T* __restrict__ v, const T* __restrict__ dout,
                      const float* __restrict__ lse, const float* __restrict__ delta,
                      const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos,
                      const int32_t* __restrict__ q_doc, int Tq, int Tk, int Hq, int Hkv,
                      float scale, int window) {
  pos_bwd_dq<T, D, false>(dq, q, k, v, dout, lse, delta, q_pos, k_pos, q_doc, Tq, Tk, Hq, Hkv,
                          scale, window);
}
template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    pos_bwd_dq_docs_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                           const T* __restrict__ v, const T* __restrict__ dout,
                           const float* __restrict__ lse, const float* __restrict__ delta,
                           const int32_t* __restrict__ q_pos, const int32_t* __restrict__ k_pos,
                           const int32_t* __restrict__ q_doc, int Tq, int Tk, int Hq, int Hkv,
                           float scale, int window) {
  pos_bwd_dq<T, D, true>(dq, q, k, v, dout, lse, delta, q_pos, k_pos, q_doc, Tq, Tk, Hq, Hkv, scale,
                         window);
}

// ============================================================================
// Host side
// ============================================================================

struct Dims {
  int64_t B, Tq, Tk, Hq, Hkv, D;
};

// Shapes arrive checked by the router (kernels/checks/attention_positions.cpp).
// CUDA's own: one storage type for every float tensor of a call, the head
// dims the kernels are built for, grid and index limits.
Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  same_dtype(op, "k", k, "q", q);
  same_dtype(op, "v", v, "q", q);
  const Dims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  need_head_dim(op, d.D);
  if (d.Tq > INT_MAX / 2 || d.Tk > INT_MAX / 2 || d.Hq > 65535 || d.B > 65535)
    fail(op, "q " + q.shape_str() + " k " + k.shape_str() +
                 " are too large (Tq, Tk < 2^30, Hq and B <= 65535)");
  return d;
}

std::string context(const Tensor& q, const Tensor& k, int64_t window, const Tensor& q_doc_start) {
  return "q " + q.shape_str() + " k " + k.shape_str() + " " + dtype_name(q.dtype) +
         " at positions" + (window > 0 ? " window " + std::to_string(window) : "") +
         (q_doc_start.empty() ? "" : " documents " + q_doc_start.shape_str());
}

// The kernels' q_doc_start ([B, Tq] I32; null: no documents).
const int32_t* kernel_doc_start(const Tensor& q_doc_start) {
  return q_doc_start.empty() ? nullptr : static_cast<const int32_t*>(q_doc_start.data);
}

// The kernels' window: 0 none; positions are int32, so any window past
// INT_MAX is as good as none.
int kernel_window(int64_t window) { return window > 0 && window < INT_MAX ? int(window) : 0; }

// delta [B, Hq, Tq] F32 for the backward, B*Hq*Tq*4 bytes.
DeltaScratch delta_scratch("attention_backward_pos delta scratch");

template <typename T, int D>
void forward_launch(const Dims& d, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                    Tensor q_pos, Tensor k_pos, const int32_t* q_doc, int window,
                    const std::string& ctx) {
  constexpr size_t smem = FwdTileSmem<D>::bytes(true);
  const bool docs = q_doc != nullptr;
  auto kernel = pos_fwd_kernel<T, D>;
  if (docs) kernel = pos_fwd_docs_kernel<T, D>;
  const char* name = docs ? "pos_fwd_docs_kernel" : "pos_fwd_kernel";
  allow_smem_of_pair<pos_fwd_kernel<T, D>, pos_fwd_docs_kernel<T, D>>(docs, smem, name);
  const dim3 grid(unsigned((d.Tq + kTileRows - 1) / kTileRows), unsigned(d.Hq), unsigned(d.B));
  launch(kernel, grid, kTileThreads, smem, stream(), static_cast<T*>(out.data),
         static_cast<float*>(lse.data), static_cast<const T*>(q.data),
         static_cast<const T*>(k.data), static_cast<const T*>(v.data),
         static_cast<const int32_t*>(q_pos.data), static_cast<const int32_t*>(k_pos.data), q_doc,
         int(d.Tq), int(d.Tk), int(d.Hq), int(d.Hkv), softmax_scale(D), window);
  KERNEL_CHECK(name, ctx);
}

template <typename T, int D>
void backward_launch(const Dims& d, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                     Tensor k, Tensor v, Tensor lse, const float* delta, Tensor q_pos,
                     Tensor k_pos, const int32_t* q_doc, int window, const std::string& ctx) {
  const float scale = softmax_scale(D);
  const auto* qp = static_cast<const int32_t*>(q_pos.data);
  const auto* kp = static_cast<const int32_t*>(k_pos.data);
  {
    constexpr size_t smem = DkvTileSmem<D>::bytes(true);
    const bool docs = q_doc != nullptr;
    auto kernel = pos_bwd_dkdv_kernel<T, D>;
    if (docs) kernel = pos_bwd_dkdv_docs_kernel<T, D>;
    const char* name = docs ? "pos_bwd_dkdv_docs_kernel" : "pos_bwd_dkdv_kernel";
    allow_smem_of_pair<pos_bwd_dkdv_kernel<T, D>, pos_bwd_dkdv_docs_kernel<T, D>>(docs, smem, name);
    const dim3 grid(unsigned((d.Tk + kTileKeys - 1) / kTileKeys), unsigned(d.Hkv), unsigned(d.B));
    launch(kernel, grid, kTileThreads, smem, stream(), static_cast<T*>(dk.data),
           static_cast<T*>(dv.data), static_cast<const T*>(q.data), static_cast<const T*>(k.data),
           static_cast<const T*>(v.data), static_cast<const T*>(dout.data),
           static_cast<const float*>(lse.data), delta, qp, kp, q_doc, int(d.Tq), int(d.Tk), int(d.Hq),
           int(d.Hkv), scale, window);
    KERNEL_CHECK(name, ctx);
  }
  {
    constexpr size_t smem = DqTileSmem<D>::bytes(true);
    const bool docs = q_doc != nullptr;
    auto kernel = pos_bwd_dq_kernel<T, D>;
    if (docs) kernel = pos_bwd_dq_docs_kernel<T, D>;
    const char* name = docs ? "pos_bwd_dq_docs_kernel" : "pos_bwd_dq_kernel";
    allow_smem_of_pair<pos_bwd_dq_kernel<T, D>, pos_bwd_dq_docs_kernel<T, D>>(docs, smem, name);
    const dim3 grid(unsigned((d.Tq + kTileRows - 1) / kTileRows), unsigned(d.Hq), unsigned(d.B));
    launch(kernel, grid, kTileThreads, smem, stream(), static_cast<T*>(dq.data),
           static_cast<const T*>(q.data), static_cast<const T*>(k.data),
           static_cast<const T*>(v.data), static_cast<const T*>(dout.data),
           static_cast<const float*>(lse.data), delta, qp, kp, q_doc, int(d.Tq), int(d.Tk), int(d.Hq),
           int(d.Hkv), scale, window);
    KERNEL_CHECK(name, ctx);
  }
}

}  // namespace

void attention_forward_pos(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor q_pos,
                           Tensor k_pos, int64_t window, Tensor q_doc_start) {
  const char* op = "attention_forward_pos";
  const Dims d = check_qkv(op, q, k, v);
  same_dtype(op, "out", out, "q", q);
  if (d.B == 0 || d.Tq == 0 || d.Hq == 0) return;
  // Tk = 0 runs too: no tile, every row out = 0, lse = -inf.
  const std::string ctx = context(q, k, window, q_doc_start);
  const int win = kernel_window(window);
  const int32_t* q_doc = kernel_doc_start(q_doc_start);
  DISPATCH_FLOAT(q.dtype, T, op, {
    with_head_dim(d.D, [&]<int kD>() {
      forward_launch<T, kD>(d, out, lse, q, k, v, q_pos, k_pos, q_doc, win, ctx);
    });
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
    launch(merge_kernel<T>, unsigned(blocks), kMergeWarps * 32, 0, stream(),
           static_cast<T*>(out.data), static_cast<float*>(lse.data),
           static_cast<const T*>(part_out.data), static_cast<const float*>(part_lse.data), rows,
           T_len, H, D);
    KERNEL_CHECK("merge_kernel", ctx);
  });
}

void attention_backward_pos(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                            Tensor v, Tensor out, Tensor lse, Tensor q_pos, Tensor k_pos,
                            int64_t window, Tensor q_doc_start) {
  const char* op = "attention_backward_pos";
  const Dims d = check_qkv(op, q, k, v);
  same_dtype(op, "out", out, "q", q);
  same_dtype(op, "dout", dout, "q", q);
  same_dtype(op, "dq", dq, "q", q);
  same_dtype(op, "dk", dk, "k", k);
  same_dtype(op, "dv", dv, "v", v);
  if (d.B == 0 || d.Tq == 0 || d.Tk == 0 || d.Hq == 0) return;
  const std::string ctx = context(q, k, window, q_doc_start);
  const int win = kernel_window(window);
  const int32_t* q_doc = kernel_doc_start(q_doc_start);
  const int64_t rows = d.B * d.Tq * d.Hq;
  float* delta = delta_scratch.get(size_t(rows));
  DISPATCH_FLOAT(q.dtype, T, op, {
    launch_delta<T>(delta, static_cast<const T*>(out.data), static_cast<const T*>(dout.data), rows,
                    d.Tq, d.Hq, d.D, ctx);
    with_head_dim(d.D, [&]<int kD>() {
      backward_launch<T, kD>(d, dq, dk, dv, dout, q, k, v, lse, delta, q_pos, k_pos, q_doc, win, ctx);
    });
  });
}

}  // namespace trainer::cuda
