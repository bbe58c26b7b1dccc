// Flash attention (forward and backward) of the CUDA backend; the semantics are
// those of ops::attention_forward / ops::attention_backward (kernels/op_list.h):
// q [B,T,Hq,D], k,v [B,T,Hkv,D], query head h reads kv head h / (Hq/Hkv),
// scale 1/sqrt(D), causal or full, out [B,T,Hq,D], lse [B,Hq,T] F32.
// A sliding window W (causal only) also masks key j < i - W for query i;
// separate documents (doc_start [B,T] I32, causal only) mask key j <
// doc_start[b,i], clamped to i. Both give row i a first key that only grows
// with i (first_key), so whatever holds for the window's tiles below holds
// for documents' too: a tile's first row bounds the keys the tile needs.
// Every kernel body takes kDocs and is built twice: NAME_kernel without
// documents, where their loads, masks and bounds compile away (the code and
// registers of the kernels before documents: ptxas' allocation moves by
// tens of registers on a few extra live values, and with it occupancy),
// and NAME_docs_kernel; the host picks by whether doc_start is given
// (allow_smem_of_pair, attention_tiles.cuh).
//
// Algorithm (FlashAttention-2): the T x T score matrix never exists in memory.
//   forward   one block of 4 warps per (b, q head, 64-row Q tile); each warp
//             owns 16 query rows and keeps its Q fragments, the output
//             accumulator O and the running (max, sum) in registers. K/V tiles
//             of 64 keys stream through shared memory (cp.async, double
//             buffered). Per tile: S = Q K^T (tensor cores), online softmax in
//             the log2 domain (exp2 of s * scale * log2 e), O = O * alpha + P V
//             with P rounded to the storage type. lse = max * ln2 + ln(sum).
//             Causal: K/V tiles after the diagonal are never loaded; masking
//             (-inf) runs only on the diagonal tile and the ragged last tile.
//             Window W: K/V tiles wholly before the band (every key < the
//             tile's first row - W) are never loaded either, so a pass costs
//             O(T W); the band's lower edge is masked like the diagonal.
//             Documents likewise: K/V tiles before the first row's document
//             are never loaded, and its start is masked.
//   backward  P is recomputed from lse, never stored.
//             (1) delta[b,h,t] = sum_d dout * out (fp32 scratch, grow-only).
//             (2) dK/dV: one block per (b, kv head, 64-key tile); each warp
//                 owns 16 keys. It loops over every query head of the GQA group
//                 and every Q tile that can see its keys (with a window, only
//                 the tiles within W rows after them; with documents, up to
//                 the first whose first row's document starts after them:
//                 a binary search over doc_start), computing S^T = K Q^T
//                 and dP^T = V dO^T, P^T = exp2(S^T*scale*log2e - lse*log2e),
//                 dS^T = P^T (dP^T - delta), then dV += P^T dO, dK += dS^T Q in
//                 registers; written once (dK * scale). The GQA sum is a plain
//                 loop: deterministic, no atomics.
//             (3) dQ: one block per (b, q head, 64-row Q tile), looping over
//                 the K/V tiles it can see: dQ += dS K, written once (* scale).
//             S and dP are computed twice (in (2) and (3)) instead of
//             accumulating dQ with float atomics: results are bitwise
//             reproducible run to run.
//
// Tiles (smem rows padded by 8 halves, so the 8 row addresses of every
// ldmatrix phase fall in distinct 16-byte bank groups; 128 threads = 4 warps):
//   forward  Br=64 Q rows, Bc=64 keys, K/V double buffered:
//            (Br + 4*Bc) * (D+8) * 2 B = 45 KiB (D=64), 85 KiB (D=128)
//   dK/dV    Bc=64 keys, Br=64 (D=64) / 32 (D=128) Q rows, Q/dO/lse/delta
//            and each row's first key double buffered: 55.5 KiB (D=64),
//            68.75 KiB (D=128)
//   dQ       Br=64 Q rows, Bc=64 (D=64) / 32 (D=128) keys, K/V double buffered:
//            54 KiB (D=64), 68 KiB (D=128)
//   (above 48 KiB the kernel is opted in once with cudaFuncSetAttribute; all
//   fit the 99 KiB of sm_86/89 as well as sm_80/90.)
//   Fragments come from shared memory by ldmatrix (.trans for the operands
//   whose reduction dimension runs down the rows: V in P V, dO/Q in dV/dK, K
//   in dQ); MMA is mma.sync.m16n8k16 (BF16 or F16 in, F32 accumulate).
//
// F32 storage (train.precision=fp32) runs a simple path: the same blocking
// with 32 x 32 tiles in fp32 shared memory and fp32 FMA, 256 threads (no
// tensor cores; correct, not fast), built from attention_tiles.cuh (tiles,
// layouts and steps shared with attention_positions.cu; delta and its
// scratch serve both paths). Its smem: forward 29 / 53 KiB, dK/dV 41 / 73
// KiB, dQ 37 / 69 KiB (D = 64 / 128). Setting TRAINER_ATTENTION_SIMPLE=1 sends
// BF16/F16 through that path too (a reference when debugging the MMA path).
//
// Cost. FLOPs (multiply-add = 2): forward 4 * B * Hq * T^2 * D (half of it
// causal); backward counted as 2.5x forward (5 matmuls against 2); this
// implementation executes 7 (S and dP twice), 3.5x forward. Bytes: forward
// reads Q once and K/V once per Q tile (T/64 times, mostly from L2), writes O
// and lse: about 2 * (2*B*T*Hq*D + 2*B*T*Hkv*D) + 4*B*Hq*T from HBM for bf16;
// backward reads Q, K, V, O, dO, lse, delta and writes dQ, dK, dV: about
// 2 * B*T*D*(4*Hq + 4*Hkv) + 8*B*Hq*T (K/V and Q/dO re-reads hit L2).
// Compute bound for T >= ~512 at D = 64/128.
//
// Head dims 32, 64 and 128 only (std::invalid_argument otherwise); 32 is the
// small models' (configs/quickstart.yaml: d_model 128 over 4 heads), with
// 64's tiles. The MMA path
// needs 16-byte aligned tensors (cp.async); views from the arenas are.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_tiles.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

using namespace attention_tiles;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The kernels take the window as `win`: key j is masked for row i when
// j < i - win. No window is a win so large that this never holds (rows stay
// below 2^30 + a tile, so i - win cannot overflow), and tile bounds that add
// it are computed in 64 bits.
constexpr int kNoWindow = INT_MAX / 2;

// The first key row `row` sees: the window's edge row - win and, with
// separate documents (ds: the sequence's doc_start row, else null), the
// start of its document, taken as at most row (a row always sees itself).
// Both only grow with the row, so a tile's first row has the tile's
// smallest first key and its last row the largest. Rows past the sequence
// (a ragged last tile's padding, never stored) take the last row's
// document, which keeps that order and reads nothing past doc_start.
__device__ __forceinline__ int first_key(int row, int win, const int32_t* ds, int seq) {
  const int w = row - win;
  return ds != nullptr ? max(w, min(int(ds[min(row, seq - 1)]), row)) : w;
}

// First K tile (of `tile` keys) that row q0 or a later row can see: the
// later of the window's and the document's (first_key(q0) / tile).
__device__ __forceinline__ int first_kv_tile(int q0, int win, const int32_t* ds, int tile) {
  const int w = q0 > win ? (q0 - win) / tile : 0;
  return ds != nullptr ? max(w, min(int(ds[q0]), q0) / tile) : w;
}
// One past the last Q tile (of `tile` rows; n tiles in all) whose rows can
// see key `last_key`: rows up to last_key + win, and with documents only
// the tiles (from `first` on) whose first row's document starts at or
// before it, since every later row's starts later still. Block-uniform.
__device__ __forceinline__ int end_q_tile(int last_key, int win, const int32_t* ds, int seq, int tile,
                                          int first, int n) {
  const int64_t t = (int64_t(last_key) + win) / tile + 1;
  int hi = t < n ? int(t) : n;
  if (ds == nullptr) return hi;
  // The first tile of [first, hi) whose first row sees nothing up to
  // last_key; a binary search, as first_key only grows.
  int lo = first;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (first_key(mid * tile, win, ds, seq) > last_key)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// ============================================================================
// Tensor-core path (BF16 / F16 storage)
// ============================================================================

constexpr int kThreads = 128;  // 4 warps per block in every MMA kernel
constexpr int kPad = 8;        // halves of padding per smem row (16 B)

template <int D> struct FwdTiles { static constexpr int Br = 64, Bc = 64; };
template <int D> struct DkvTiles { static constexpr int Bc = 64, Br = D <= 64 ? 64 : 32; };
template <int D> struct DqTiles { static constexpr int Br = 64, Bc = D <= 64 ? 64 : 32; };

template <typename T, int D> constexpr size_t fwd_smem_bytes() {
  return size_t(FwdTiles<D>::Br + 4 * FwdTiles<D>::Bc) * (D + kPad) * sizeof(T);
}
// With documents, each Q row's first key is staged beside its lse and delta.
template <typename T, int D> constexpr size_t dkdv_smem_bytes(bool docs) {
  return size_t(2 * DkvTiles<D>::Bc + 4 * DkvTiles<D>::Br) * (D + kPad) * sizeof(T) +
         size_t(4 * DkvTiles<D>::Br) * sizeof(float) +
         (docs ? size_t(2 * DkvTiles<D>::Br) * sizeof(int) : 0);
}
template <typename T, int D> constexpr size_t dq_smem_bytes() {
  return size_t(2 * DqTiles<D>::Br + 4 * DqTiles<D>::Bc) * (D + kPad) * sizeof(T);
}
// Every configuration must fit attention_tiles.cuh's kMaxSmem.
static_assert(fwd_smem_bytes<__nv_bfloat16, 128>() <= kMaxSmem, "forward smem");
static_assert(dkdv_smem_bytes<__nv_bfloat16, 128>(true) <= kMaxSmem, "dK/dV smem");
static_assert(dq_smem_bytes<__nv_bfloat16, 128>() <= kMaxSmem, "dQ smem");

// Two floats rounded to T, lo in the low half.
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// The A fragment of a 16x16 block whose two k-halves are the accumulators of
// two adjacent 8-column MMA tiles (c_lo: columns 0-7, c_hi: 8-15): how a score
// tile becomes the left operand of the next product without leaving registers.
template <typename T>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c_lo)[4],
                                         const float (&c_hi)[4]) {
  a[0] = pack2<T>(c_lo[0], c_lo[1]);
  a[1] = pack2<T>(c_lo[2], c_lo[3]);
  a[2] = pack2<T>(c_hi[0], c_hi[1]);
  a[3] = pack2<T>(c_hi[2], c_hi[3]);
}

// Reductions over the 4 lanes of a quad (the 4 threads sharing an MMA row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ void store_u32(void* p, uint32_t v) { *static_cast<uint32_t*>(p) = v; }

// Per-lane element offsets of the ldmatrix row addresses inside a tile with
// row stride LD, relative to the 16x16 block's top-left corner:
//   off_a: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
//          -> the A fragment of a row-major [m][k] block, or with .trans the
//             B fragments of n-tiles 0 and 1 of a [k][n] block;
//   off_b: matrices (rows 0-7, cols 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15)
//          -> the B fragments {b0, b1} of n-tile 0 then of n-tile 1 of a
//             block stored [n][k] (B = tile^T, k contiguous).
template <int LD> __device__ __forceinline__ int ldsm_off_a(int lane) {
  return (lane & 15) * LD + 8 * (lane >> 4);
}
template <int LD> __device__ __forceinline__ int ldsm_off_b(int lane) {
  return ((lane & 7) + 8 * (lane >> 4)) * LD + 8 * ((lane >> 3) & 1);
}

// ROWS x D tile, global rows `stride` elements apart -> smem rows D + kPad
// apart, by cp.async; rows >= valid_rows are zero-filled. g is the tile's
// first row (always a real row: tiles start below T).
template <typename T, int D, int ROWS>
__device__ __forceinline__ void cp_tile(T* s, const T* g, int64_t stride, int valid_rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int LD = D + kPad;
  static_assert(ROWS * kChunks % kThreads == 0, "tile does not split evenly over the block");
#pragma unroll
  for (int i = 0; i < ROWS * kChunks / kThreads; ++i) {
    const int c = int(threadIdx.x) + i * kThreads;
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = r < valid_rows;
    cp_async_16(s + r * LD + col, ok ? g + r * stride + col : g, ok);
  }
}

// ---- forward ----------------------------------------------------------------

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    flash_fwd(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
              const T* __restrict__ k, const T* __restrict__ v, const int32_t* __restrict__ doc,
              int seq, int Hq, int Hkv, float scale_log2, bool causal, int win) {
  constexpr int Br = FwdTiles<D>::Br, Bc = FwdTiles<D>::Bc, LD = D + kPad;
  static_assert(Br == 16 * (kThreads / 32), "one warp per 16 query rows");
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [Br][LD]
  T* Ks = Qs + Br * LD;                     // [2][Bc][LD]
  T* Vs = Ks + 2 * Bc * LD;                 // [2][Bc][LD]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);  // longest (causal) tiles first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int q0 = qt * Br;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const T* qg = q + (int64_t(b) * seq + q0) * ldq + int64_t(h) * D;
  const T* kg = k + int64_t(b) * seq * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * seq * ldk + int64_t(kvh) * D;
  const int n_kv_all = (seq + Bc - 1) / Bc;
  const int n_kv = causal ? min(n_kv_all, (q0 + Br - 1) / Bc + 1) : n_kv_all;
  const int32_t* ds = kDocs ? doc + int64_t(b) * seq : nullptr;
  // Tiles before j0 lie behind every row's window and before its document.
  const int j0 = first_kv_tile(q0, win, ds, Bc);
  // Rows g and g + 8 of this warp's 16 mask keys before their first; a tile
  // starting before the last row's first key holds such keys.
  const int lo[2] = {first_key(q0 + warp * 16 + g, win, ds, seq),
                     first_key(q0 + warp * 16 + g + 8, win, ds, seq)};
  const int lo_last = first_key(q0 + Br - 1, win, ds, seq);
  const int off_a = ldsm_off_a<LD>(lane), off_b = ldsm_off_b<LD>(lane);

  cp_tile<T, D, Br>(Qs, qg, ldq, seq - q0);
  cp_async_commit();
  cp_tile<T, D, Bc>(Ks + (j0 & 1) * Bc * LD, kg + int64_t(j0) * Bc * ldk, ldk, seq - j0 * Bc);
  cp_tile<T, D, Bc>(Vs + (j0 & 1) * Bc * LD, vg + int64_t(j0) * Bc * ldk, ldk, seq - j0 * Bc);
  cp_async_commit();

  cp_async_wait<1>();  // Q has landed
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) ldsm_x4(qf[kc], Qs + warp * 16 * LD + kc * 16 + off_a);

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g and g+8 (log2 domain)
  float l[2] = {0.f, 0.f};              // this lane's share of the running sums

  for (int j = j0; j < n_kv; ++j) {
    if (j + 1 < n_kv) {
      const int nb = (j + 1) & 1, k1 = (j + 1) * Bc;
      cp_tile<T, D, Bc>(Ks + nb * Bc * LD, kg + k1 * ldk, ldk, seq - k1);
      cp_tile<T, D, Bc>(Vs + nb * Bc * LD, vg + k1 * ldk, ldk, seq - k1);
    }
    cp_async_commit();  // possibly empty: keeps the group count uniform
    cp_async_wait<1>();  // tile j has landed
    __syncthreads();
    const T* Kb = Ks + (j & 1) * Bc * LD;
    const T* Vb = Vs + (j & 1) * Bc * LD;

    // S = Q K^T: 16 rows x Bc keys per warp.
    float s[Bc / 8][4];
#pragma unroll
    for (int i = 0; i < Bc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
      for (int np = 0; np < Bc / 16; ++np) {
        uint32_t bf[4];
        ldsm_x4(bf, Kb + np * 16 * LD + kc * 16 + off_b);
        mma_16816<T>(s[2 * np], qf[kc], bf[0], bf[1]);
        mma_16816<T>(s[2 * np + 1], qf[kc], bf[2], bf[3]);
      }
    }

    // Scale into the log2 domain; mask keys past T, (causal) after the row
    // and before its first key (window, document).
    const int k0 = j * Bc;
    const bool need_mask = k0 + Bc > seq || (causal && k0 + Bc - 1 > q0) ||
                           k0 < (kDocs ? lo_last : q0 + Br - 1 - win);
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e] * scale_log2;
        if (need_mask) {
          const int key = k0 + nt * 8 + 2 * t + (e & 1);
          const int row = q0 + warp * 16 + g + 8 * (e >> 1);
          if (key >= seq || (causal && key > row) || key < (kDocs ? lo[e >> 1] : row - win))
            x = -INFINITY;
        }
        s[nt][e] = x;
      }
    }

    // Online softmax; rows g (r = 0) and g + 8 (r = 1) of the warp's 16.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = quad_max(mx);
      const float ref = mx == -INFINITY ? 0.f : mx;  // all masked so far: exp2(-inf - 0) = 0
      const float alpha = fast_exp2(m[r] - ref);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          const float p = fast_exp2(s[nt][e] - ref);
          s[nt][e] = p;
          sum += p;
        }
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][2 * r] *= alpha;
        o[nd][2 * r + 1] *= alpha;
      }
    }

    // O += P V: P from registers, V^T fragments by ldmatrix.trans.
#pragma unroll
    for (int kc = 0; kc < Bc / 16; ++kc) {
      uint32_t a[4];
      acc_to_a<T>(a, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t bf[4];
        ldsm_x4_trans(bf, Vb + kc * 16 * LD + np * 16 + off_a);
        mma_16816<T>(o[2 * np], a, bf[0], bf[1]);
        mma_16816<T>(o[2 * np + 1], a, bf[2], bf[3]);
      }
    }
    __syncthreads();  // everyone is done with buffer j & 1 before it is refilled
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = quad_sum(l[r]);
    const int row = q0 + warp * 16 + g + 8 * r;
    if (row < seq) {
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      T* orow = out + (int64_t(b) * seq + row) * ldq + int64_t(h) * D + 2 * t;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd)
        store_u32(orow + nd * 8, pack2<T>(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv));
      if (t == 0) lse[(int64_t(b) * Hq + h) * seq + row] = m[r] * kLn2 + logf(sum);
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                     const T* __restrict__ k, const T* __restrict__ v,
                     const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale_log2,
                     bool causal, int win) {
  flash_fwd<T, D, false>(out, lse, q, k, v, doc, seq, Hq, Hkv, scale_log2, causal, win);
}
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_fwd_docs_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                          const T* __restrict__ k, const T* __restrict__ v,
                          const int32_t* __restrict__ doc, int seq, int Hq, int Hkv,
                          float scale_log2, bool causal, int win) {
  flash_fwd<T, D, true>(out, lse, q, k, v, doc, seq, Hq, Hkv, scale_log2, causal, win);
}

// ---- backward: delta = rowsum(dout * out): attention_tiles.cuh -----------

// ---- backward: dK, dV -------------------------------------------------------

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    flash_bwd_dkdv(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                   const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                   const float* __restrict__ lse, const float* __restrict__ delta,
                   const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                   float scale_log2, bool causal, int win) {
  constexpr int Bc = DkvTiles<D>::Bc, Br = DkvTiles<D>::Br, LD = D + kPad;
  static_assert(Bc == 16 * (kThreads / 32), "one warp per 16 keys");
  static_assert(Br <= kThreads, "lse/delta staging assumes Br <= threads");
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  T* Ks = reinterpret_cast<T*>(smem_raw);  // [Bc][LD]
  T* Vs = Ks + Bc * LD;                     // [Bc][LD]
  T* Qs = Vs + Bc * LD;                     // [2][Br][LD]
  T* dOs = Qs + 2 * Br * LD;                // [2][Br][LD]
  float* Ls = reinterpret_cast<float*>(dOs + 2 * Br * LD);  // [2][Br] lse * log2(e)
  float* Ds = Ls + 2 * Br;                                  // [2][Br] delta
  int* Fs = reinterpret_cast<int*>(Ds + 2 * Br);            // [2][Br] first key (first_key)

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;  // kt = 0 has the most work
  const int group = Hq / Hkv;
  const int k0 = kt * Bc;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int n_qt = (seq + Br - 1) / Br;
  const int qt_first = causal ? k0 / Br : 0;  // earlier Q tiles cannot see these keys
  // Nor can later ones than the last row within the window of the last key,
  // or than the last whose first row's document starts by it.
  const int32_t* ds = kDocs ? doc + int64_t(b) * seq : nullptr;
  const int qt_end = end_q_tile(k0 + Bc - 1, win, ds, seq, Br, qt_first, n_qt);
  const int per_head = qt_end - qt_first;     // >= 1 since k0 < seq
  const int n_it = group * per_head;
  const int off_a = ldsm_off_a<LD>(lane), off_b = ldsm_off_b<LD>(lane);

  const int64_t kv_off = (int64_t(b) * seq + k0) * ldk + int64_t(kvh) * D;
  cp_tile<T, D, Bc>(Ks, k + kv_off, ldk, seq - k0);
  cp_tile<T, D, Bc>(Vs, v + kv_off, ldk, seq - k0);

  // Iteration it -> query head kvh * group + it / per_head, Q tile qt_first + it % per_head.
  auto load = [&](int it, int buf) {
    const int h = kvh * group + it / per_head, q0 = (qt_first + it % per_head) * Br;
    const int64_t off = (int64_t(b) * seq + q0) * ldq + int64_t(h) * D;
    cp_tile<T, D, Br>(Qs + buf * Br * LD, q + off, ldq, seq - q0);
    cp_tile<T, D, Br>(dOs + buf * Br * LD, dout + off, ldq, seq - q0);
    if (int(threadIdx.x) < Br) {
      const int row = q0 + int(threadIdx.x);
      const bool ok = row < seq;
      const int64_t idx = (int64_t(b) * Hq + h) * seq + row;
      Ls[buf * Br + threadIdx.x] = ok ? lse[idx] * kLog2e : 0.f;
      Ds[buf * Br + threadIdx.x] = ok ? delta[idx] : 0.f;
      if (kDocs) Fs[buf * Br + threadIdx.x] = first_key(row, win, ds, seq);
    }
  };
  load(0, 0);
  cp_async_commit();

  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[i][e] = dva[i][e] = 0.f;

  for (int it = 0; it < n_it; ++it) {
    if (it + 1 < n_it) load(it + 1, (it + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int buf = it & 1;
    const T* Qb = Qs + buf * Br * LD;
    const T* dOb = dOs + buf * Br * LD;
    const float* Lb = Ls + buf * Br;
    const float* Db = Ds + buf * Br;
    const int* Fb = Fs + buf * Br;
    const int q0 = (qt_first + it % per_head) * Br;

    // S^T = K Q^T and dP^T = V dO^T: 16 keys x Br queries per warp.
    float s[Br / 8][4], dp[Br / 8][4];
#pragma unroll
    for (int i = 0; i < Br / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
      uint32_t ak[4], av[4];
      ldsm_x4(ak, Ks + warp * 16 * LD + kc * 16 + off_a);
      ldsm_x4(av, Vs + warp * 16 * LD + kc * 16 + off_a);
#pragma unroll
      for (int np = 0; np < Br / 16; ++np) {
        uint32_t bq[4], bo[4];
        ldsm_x4(bq, Qb + np * 16 * LD + kc * 16 + off_b);
        ldsm_x4(bo, dOb + np * 16 * LD + kc * 16 + off_b);
        mma_16816<T>(s[2 * np], ak, bq[0], bq[1]);
        mma_16816<T>(s[2 * np + 1], ak, bq[2], bq[3]);
        mma_16816<T>(dp[2 * np], av, bo[0], bo[1]);
        mma_16816<T>(dp[2 * np + 1], av, bo[2], bo[3]);
      }
    }

    // P^T = exp2(S^T * scale * log2e - lse * log2e); dS^T = P^T (dP^T - delta).
    // Element (nt, e): key k0 + 16 warp + g + 8 (e >> 1), query q0 + 8 nt + 2t + (e & 1).
    // A row masks the keys before its first (window, document); the tile's
    // last row has the largest first key.
    const bool need_mask =
        q0 + Br > seq || k0 + Bc > seq || (causal && k0 + Bc - 1 > q0) ||
        k0 < (kDocs ? Fb[Br - 1] : q0 + Br - 1 - win);
#pragma unroll
    for (int nt = 0; nt < Br / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * t + (e & 1);
        float p = fast_exp2(s[nt][e] * scale_log2 - Lb[qi]);
        if (need_mask) {
          const int row = q0 + qi, key = k0 + warp * 16 + g + 8 * (e >> 1);
          if (row >= seq || key >= seq || (causal && key > row) || key < (kDocs ? Fb[qi] : row - win))
            p = 0.f;
        }
        dp[nt][e] = p * (dp[nt][e] - Db[qi]);
        s[nt][e] = p;
      }
    }

    // dV += P^T dO, dK += dS^T Q (reduction over the Br queries).
#pragma unroll
    for (int kc = 0; kc < Br / 16; ++kc) {
      uint32_t ap[4], ads[4];
      acc_to_a<T>(ap, s[2 * kc], s[2 * kc + 1]);
      acc_to_a<T>(ads, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t bo[4], bq[4];
        ldsm_x4_trans(bo, dOb + kc * 16 * LD + np * 16 + off_a);
        mma_16816<T>(dva[2 * np], ap, bo[0], bo[1]);
        mma_16816<T>(dva[2 * np + 1], ap, bo[2], bo[3]);
        ldsm_x4_trans(bq, Qb + kc * 16 * LD + np * 16 + off_a);
        mma_16816<T>(dka[2 * np], ads, bq[0], bq[1]);
        mma_16816<T>(dka[2 * np + 1], ads, bq[2], bq[3]);
      }
    }
    __syncthreads();  // buffer it & 1 is free for iteration it + 2's load
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = k0 + warp * 16 + g + 8 * r;
    if (key < seq) {
      const int64_t off = (int64_t(b) * seq + key) * ldk + int64_t(kvh) * D + 2 * t;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        store_u32(dk + off + nd * 8, pack2<T>(dka[nd][2 * r] * scale, dka[nd][2 * r + 1] * scale));
        store_u32(dv + off + nd * 8, pack2<T>(dva[nd][2 * r], dva[nd][2 * r + 1]));
      }
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                          const T* __restrict__ k, const T* __restrict__ v,
                          const T* __restrict__ dout, const float* __restrict__ lse,
                          const float* __restrict__ delta, const int32_t* __restrict__ doc, int seq,
                          int Hq, int Hkv, float scale, float scale_log2, bool causal, int win) {
  flash_bwd_dkdv<T, D, false>(dk, dv, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale,
                              scale_log2, causal, win);
}
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dkdv_docs_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                               const T* __restrict__ k, const T* __restrict__ v,
                               const T* __restrict__ dout, const float* __restrict__ lse,
                               const float* __restrict__ delta, const int32_t* __restrict__ doc,
                               int seq, int Hq, int Hkv, float scale, float scale_log2, bool causal,
                               int win) {
  flash_bwd_dkdv<T, D, true>(dk, dv, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale,
                             scale_log2, causal, win);
}

// ---- backward: dQ -----------------------------------------------------------

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    flash_bwd_dq(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                 const T* __restrict__ v, const T* __restrict__ dout, const float* __restrict__ lse,
                 const float* __restrict__ delta, const int32_t* __restrict__ doc, int seq, int Hq,
                 int Hkv, float scale, float scale_log2, bool causal, int win) {
  constexpr int Br = DqTiles<D>::Br, Bc = DqTiles<D>::Bc, LD = D + kPad;
  static_assert(Br == 16 * (kThreads / 32), "one warp per 16 query rows");
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  T* Qs = reinterpret_cast<T*>(smem_raw);  // [Br][LD]
  T* dOs = Qs + Br * LD;                    // [Br][LD]
  T* Ks = dOs + Br * LD;                    // [2][Bc][LD]
  T* Vs = Ks + 2 * Bc * LD;                 // [2][Bc][LD]

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int q0 = qt * Br;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t q_off = (int64_t(b) * seq + q0) * ldq + int64_t(h) * D;
  const T* kg = k + int64_t(b) * seq * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * seq * ldk + int64_t(kvh) * D;
  const int n_kv_all = (seq + Bc - 1) / Bc;
  const int n_kv = causal ? min(n_kv_all, (q0 + Br - 1) / Bc + 1) : n_kv_all;
  const int32_t* ds = kDocs ? doc + int64_t(b) * seq : nullptr;
  const int j0 = first_kv_tile(q0, win, ds, Bc);
  // As the forward: rows g and g + 8's first keys, the tile's last row's.
  const int lo[2] = {first_key(q0 + warp * 16 + g, win, ds, seq),
                     first_key(q0 + warp * 16 + g + 8, win, ds, seq)};
  const int lo_last = first_key(q0 + Br - 1, win, ds, seq);
  const int off_a = ldsm_off_a<LD>(lane), off_b = ldsm_off_b<LD>(lane);

  cp_tile<T, D, Br>(Qs, q + q_off, ldq, seq - q0);
  cp_tile<T, D, Br>(dOs, dout + q_off, ldq, seq - q0);
  cp_async_commit();
  cp_tile<T, D, Bc>(Ks + (j0 & 1) * Bc * LD, kg + int64_t(j0) * Bc * ldk, ldk, seq - j0 * Bc);
  cp_tile<T, D, Bc>(Vs + (j0 & 1) * Bc * LD, vg + int64_t(j0) * Bc * ldk, ldk, seq - j0 * Bc);
  cp_async_commit();

  // Rows g and g + 8 of this warp's 16: lse (log2 domain) and delta.
  float lse2[2], dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    const bool ok = row < seq;
    const int64_t idx = (int64_t(b) * Hq + h) * seq + row;
    lse2[r] = ok ? lse[idx] * kLog2e : 0.f;
    dl[r] = ok ? delta[idx] : 0.f;
  }

  cp_async_wait<1>();  // Q and dO have landed
  __syncthreads();
  uint32_t qf[D / 16][4], of[D / 16][4];
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    ldsm_x4(qf[kc], Qs + warp * 16 * LD + kc * 16 + off_a);
    ldsm_x4(of[kc], dOs + warp * 16 * LD + kc * 16 + off_a);
  }

  float dqa[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;

  for (int j = j0; j < n_kv; ++j) {
    if (j + 1 < n_kv) {
      const int nb = (j + 1) & 1, k1 = (j + 1) * Bc;
      cp_tile<T, D, Bc>(Ks + nb * Bc * LD, kg + k1 * ldk, ldk, seq - k1);
      cp_tile<T, D, Bc>(Vs + nb * Bc * LD, vg + k1 * ldk, ldk, seq - k1);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* Kb = Ks + (j & 1) * Bc * LD;
    const T* Vb = Vs + (j & 1) * Bc * LD;

    // S = Q K^T, dP = dO V^T: 16 rows x Bc keys per warp.
    float s[Bc / 8][4], dp[Bc / 8][4];
#pragma unroll
    for (int i = 0; i < Bc / 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int kc = 0; kc < D / 16; ++kc) {
#pragma unroll
      for (int np = 0; np < Bc / 16; ++np) {
        uint32_t bk[4], bv[4];
        ldsm_x4(bk, Kb + np * 16 * LD + kc * 16 + off_b);
        ldsm_x4(bv, Vb + np * 16 * LD + kc * 16 + off_b);
        mma_16816<T>(s[2 * np], qf[kc], bk[0], bk[1]);
        mma_16816<T>(s[2 * np + 1], qf[kc], bk[2], bk[3]);
        mma_16816<T>(dp[2 * np], of[kc], bv[0], bv[1]);
        mma_16816<T>(dp[2 * np + 1], of[kc], bv[2], bv[3]);
      }
    }

    // dS = P (dP - delta), P = exp2(S * scale * log2e - lse * log2e).
    const int k0 = j * Bc;
    const bool need_mask = k0 + Bc > seq || (causal && k0 + Bc - 1 > q0) ||
                           k0 < (kDocs ? lo_last : q0 + Br - 1 - win);
#pragma unroll
    for (int nt = 0; nt < Bc / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = fast_exp2(s[nt][e] * scale_log2 - lse2[r]);
        if (need_mask) {
          const int key = k0 + nt * 8 + 2 * t + (e & 1);
          const int row = q0 + warp * 16 + g + 8 * r;
          if (key >= seq || (causal && key > row) || key < (kDocs ? lo[r] : row - win)) p = 0.f;
        }
        dp[nt][e] = p * (dp[nt][e] - dl[r]);
      }
    }

    // dQ += dS K (reduction over the Bc keys; K^T fragments by ldmatrix.trans).
#pragma unroll
    for (int kc = 0; kc < Bc / 16; ++kc) {
      uint32_t a[4];
      acc_to_a<T>(a, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t bk[4];
        ldsm_x4_trans(bk, Kb + kc * 16 * LD + np * 16 + off_a);
        mma_16816<T>(dqa[2 * np], a, bk[0], bk[1]);
        mma_16816<T>(dqa[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + warp * 16 + g + 8 * r;
    if (row < seq) {
      T* drow = dq + (int64_t(b) * seq + row) * ldq + int64_t(h) * D + 2 * t;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd)
        store_u32(drow + nd * 8, pack2<T>(dqa[nd][2 * r] * scale, dqa[nd][2 * r + 1] * scale));
    }
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dq_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                        const T* __restrict__ v, const T* __restrict__ dout,
                        const float* __restrict__ lse, const float* __restrict__ delta,
                        const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                        float scale_log2, bool causal, int win) {
  flash_bwd_dq<T, D, false>(dq, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale, scale_log2,
                            causal, win);
}
template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dq_docs_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                             const T* __restrict__ v, const T* __restrict__ dout,
                             const float* __restrict__ lse, const float* __restrict__ delta,
                             const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                             float scale_log2, bool causal, int win) {
  flash_bwd_dq<T, D, true>(dq, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale, scale_log2,
                           causal, win);
}

// ============================================================================
// Simple path: fp32 arithmetic in shared memory, any float storage type
// ============================================================================
//
// The tiles, layouts and steps of attention_tiles.cuh (32 query rows x 32
// keys, 256 threads); here the masks are causal / window / document / past T.

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    simple_fwd(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
               const T* __restrict__ k, const T* __restrict__ v, const int32_t* __restrict__ doc,
               int seq, int Hq, int Hkv, float scale, bool causal, int win) {
  constexpr int LDF = D + 1, LDS = kTileKeys + 1, PER = tile_per_thread<D>();
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  const FwdTileSmem<D> s(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int q0 = qt * kTileRows;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const T* kg = k + int64_t(b) * seq * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * seq * ldk + int64_t(kvh) * D;

  load_tile_f32<T, D>(s.Qs, q + (int64_t(b) * seq + q0) * ldq + int64_t(h) * D, ldq, seq - q0);
  if (tid < kTileRows) {
    s.Ms[tid] = -INFINITY;
    s.Ls[tid] = 0.f;
  }
  float o[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) o[i] = 0.f;
  const int32_t* ds = kDocs ? doc + int64_t(b) * seq : nullptr;

  const int n_kv_all = (seq + kTileKeys - 1) / kTileKeys;
  const int n_kv = causal ? min(n_kv_all, (q0 + kTileRows - 1) / kTileKeys + 1) : n_kv_all;
  for (int j = first_kv_tile(q0, win, ds, kTileKeys); j < n_kv; ++j) {
    const int k0 = j * kTileKeys;
    __syncthreads();  // previous tile fully consumed (and Q / stats visible at the first)
    load_tile_f32<T, D>(s.Ks, kg + k0 * ldk, ldk, seq - k0);
    load_tile_f32<T, D>(s.Vs, vg + k0 * ldk, ldk, seq - k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTileRows / 8; ++i) {
      const int r = warp + 8 * i, key = k0 + lane, row = q0 + r;
      float x = dot_rows<D>(s.Qs + r * LDF, s.Ks + lane * LDF) * scale;
      if (key >= seq || (causal && key > row) || key < first_key(row, win, ds, seq)) x = -INFINITY;
      s.Ss[r * LDS + lane] = x;
    }
    __syncthreads();
    online_softmax_tile<D>(s);
    __syncthreads();
    accumulate_pv<D>(o, s);
  }
  __syncthreads();
  store_out_tile<T, D>(out, o, s.Ls, q0, seq, b, h, ldq);
  if (tid < kTileRows && q0 + tid < seq)
    lse[(int64_t(b) * Hq + h) * seq + q0 + tid] = s.Ms[tid] + logf(s.Ls[tid]);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    simple_fwd_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                      const T* __restrict__ k, const T* __restrict__ v,
                      const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                      bool causal, int win) {
  simple_fwd<T, D, false>(out, lse, q, k, v, doc, seq, Hq, Hkv, scale, causal, win);
}
template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    simple_fwd_docs_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                           const T* __restrict__ k, const T* __restrict__ v,
                           const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                           bool causal, int win) {
  simple_fwd<T, D, true>(out, lse, q, k, v, doc, seq, Hq, Hkv, scale, causal, win);
}

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    simple_bwd_dkdv(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ dout,
                    const float* __restrict__ lse, const float* __restrict__ delta,
                    const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                    bool causal, int win) {
  constexpr int LDF = D + 1, LDS = kTileKeys + 1, PER = tile_per_thread<D>();
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  const DkvTileSmem<D> s(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, group = Hq / Hkv;
  const int k0 = kt * kTileKeys;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t kv_off = (int64_t(b) * seq + k0) * ldk + int64_t(kvh) * D;
  load_tile_f32<T, D>(s.Ks, k + kv_off, ldk, seq - k0);
  load_tile_f32<T, D>(s.Vs, v + kv_off, ldk, seq - k0);

  float dka[PER], dva[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) dka[i] = dva[i] = 0.f;

  const int n_qt = (seq + kTileRows - 1) / kTileRows;
  const int qt_first = causal ? k0 / kTileRows : 0;
  const int32_t* ds = kDocs ? doc + int64_t(b) * seq : nullptr;
  const int qt_end = end_q_tile(k0 + kTileKeys - 1, win, ds, seq, kTileRows, qt_first, n_qt);
  for (int hh = 0; hh < group; ++hh) {
    const int h = kvh * group + hh;
    for (int qt = qt_first; qt < qt_end; ++qt) {
      const int q0 = qt * kTileRows;
      const int64_t q_off = (int64_t(b) * seq + q0) * ldq + int64_t(h) * D;
      __syncthreads();  // previous tile fully consumed
      load_tile_f32<T, D>(s.Qs, q + q_off, ldq, seq - q0);
      load_tile_f32<T, D>(s.dOs, dout + q_off, ldq, seq - q0);
      load_row_stats(s.Lr, s.Dr, lse, delta, b, h, Hq, q0, seq, 0.f);
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kTileRows / 8; ++i) {
        const int r = warp + 8 * i, row = q0 + r, key = k0 + lane;
        const float sc = dot_rows<D>(s.Qs + r * LDF, s.Ks + lane * LDF);
        const float gp = dot_rows<D>(s.dOs + r * LDF, s.Vs + lane * LDF);
        const bool masked = row >= seq || key >= seq || (causal && key > row) ||
                            key < first_key(row, win, ds, seq);
        const float p = masked ? 0.f : expf(sc * scale - s.Lr[r]);
        s.Ps[r * LDS + lane] = p;
        s.dSs[r * LDS + lane] = p * (gp - s.Dr[r]);
      }
      __syncthreads();
      accumulate_dkdv<D>(dka, dva, s);
    }
  }
  store_dkdv_tile<false, T, D>(dk, dv, dka, dva, k0, seq, b, kvh, ldk, scale);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    simple_bwd_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                           const T* __restrict__ k, const T* __restrict__ v,
                           const T* __restrict__ dout, const float* __restrict__ lse,
                           const float* __restrict__ delta, const int32_t* __restrict__ doc,
                           int seq, int Hq, int Hkv, float scale, bool causal, int win) {
  simple_bwd_dkdv<T, D, false>(dk, dv, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale, causal,
                               win);
}
template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    simple_bwd_dkdv_docs_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ q,
                                const T* __restrict__ k, const T* __restrict__ v,
                                const T* __restrict__ dout, const float* __restrict__ lse,
                                const float* __restrict__ delta, const int32_t* __restrict__ doc,
                                int seq, int Hq, int Hkv, float scale, bool causal, int win) {
  simple_bwd_dkdv<T, D, true>(dk, dv, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale, causal,
                              win);
}

template <typename T, int D, bool kDocs>
__device__ __forceinline__ void
    simple_bwd_dq(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const T* __restrict__ dout,
                  const float* __restrict__ lse, const float* __restrict__ delta,
                  const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                  bool causal, int win) {
  constexpr int LDF = D + 1, LDS = kTileKeys + 1, PER = tile_per_thread<D>();
  TRAINER_DYNAMIC_SHARED(unsigned char, smem_raw, 16);
  const DqTileSmem<D> s(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qt = int(gridDim.x) - 1 - int(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (Hq / Hkv);
  const int q0 = qt * kTileRows;
  const int64_t ldq = int64_t(Hq) * D, ldk = int64_t(Hkv) * D;
  const int64_t q_off = (int64_t(b) * seq + q0) * ldq + int64_t(h) * D;
  const T* kg = k + int64_t(b) * seq * ldk + int64_t(kvh) * D;
  const T* vg = v + int64_t(b) * seq * ldk + int64_t(kvh) * D;

  load_tile_f32<T, D>(s.Qs, q + q_off, ldq, seq - q0);
  load_tile_f32<T, D>(s.dOs, dout + q_off, ldq, seq - q0);
  load_row_stats(s.Lr, s.Dr, lse, delta, b, h, Hq, q0, seq, 0.f);
  float dqa[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) dqa[i] = 0.f;
  const int32_t* ds = kDocs ? doc + int64_t(b) * seq : nullptr;
  int lo[kTileRows / 8];  // this thread's rows warp + 8 i: their first keys
#pragma unroll
  for (int i = 0; i < kTileRows / 8; ++i) lo[i] = first_key(q0 + warp + 8 * i, win, ds, seq);

  const int n_kv_all = (seq + kTileKeys - 1) / kTileKeys;
  const int n_kv = causal ? min(n_kv_all, (q0 + kTileRows - 1) / kTileKeys + 1) : n_kv_all;
  for (int j = first_kv_tile(q0, win, ds, kTileKeys); j < n_kv; ++j) {
    const int k0 = j * kTileKeys;
    __syncthreads();
    load_tile_f32<T, D>(s.Ks, kg + k0 * ldk, ldk, seq - k0);
    load_tile_f32<T, D>(s.Vs, vg + k0 * ldk, ldk, seq - k0);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTileRows / 8; ++i) {
      const int r = warp + 8 * i, row = q0 + r, key = k0 + lane;
      const float sc = dot_rows<D>(s.Qs + r * LDF, s.Ks + lane * LDF);
      const float gp = dot_rows<D>(s.dOs + r * LDF, s.Vs + lane * LDF);
      const bool masked =
          key >= seq || (causal && key > row) || key < (kDocs ? lo[i] : row - win);
      const float p = masked ? 0.f : expf(sc * scale - s.Lr[r]);
      s.dSs[r * LDS + lane] = p * (gp - s.Dr[r]);
    }
    __syncthreads();
    accumulate_dq<D>(dqa, s);
  }
  store_dq_tile<false, T, D>(dq, dqa, q0, seq, b, h, ldq, scale);
}

template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    simple_bwd_dq_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                         const T* __restrict__ v, const T* __restrict__ dout,
                         const float* __restrict__ lse, const float* __restrict__ delta,
                         const int32_t* __restrict__ doc, int seq, int Hq, int Hkv, float scale,
                         bool causal, int win) {
  simple_bwd_dq<T, D, false>(dq, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale, causal, win);
}
template <typename T, int D>
__global__ void __launch_bounds__(kTileThreads, 1)
    simple_bwd_dq_docs_kernel(T* __restrict__ dq, const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, const T* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              const int32_t* __restrict__ doc, int seq, int Hq, int Hkv,
                              float scale, bool causal, int win) {
  simple_bwd_dq<T, D, true>(dq, q, k, v, dout, lse, delta, doc, seq, Hq, Hkv, scale, causal, win);
}

// ============================================================================
// Host side
// ============================================================================

struct Dims {
  int64_t B, T, Hq, Hkv, D;
};

// Shapes arrive checked by the router (kernels/checks/attention.cpp). What
// is CUDA's own: one storage type for every float tensor of a call (the
// kernels are templated on it), the head dims the kernels are built for,
// and grid limits.
Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  same_dtype(op, "k", k, "q", q);
  same_dtype(op, "v", v, "q", q);
  const Dims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  need_head_dim(op, d.D);
  if (d.T > INT_MAX / 2 || d.Hq > 65535 || d.B > 65535)
    fail(op, "q " + q.shape_str() + " is too large (T < 2^30, Hq and B <= 65535)");
  return d;
}

void need_aligned(const char* op, const char* name, const Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    fail(op, std::string(name) + " " + t.shape_str() + " is not 16-byte aligned");
}

std::string context(const Tensor& q, const Tensor& k, bool causal, int64_t window,
                    const Tensor& doc_start) {
  return "q " + q.shape_str() + " k " + k.shape_str() + " " + dtype_name(q.dtype) +
         (causal ? " causal" : " full") + (window > 0 ? " window " + std::to_string(window) : "") +
         (doc_start.empty() ? "" : " documents " + doc_start.shape_str());
}

// The kernels' doc_start ([B, T] I32; null: no documents).
const int32_t* kernel_doc_start(const Tensor& doc_start) {
  return doc_start.empty() ? nullptr : static_cast<const int32_t*>(doc_start.data);
}

// The kernels' `win` (kNoWindow: none; the router allows a window only with causal).
int kernel_window(bool causal, int64_t window) {
  return causal && window > 0 ? int(std::min<int64_t>(window, kNoWindow)) : kNoWindow;
}

// TRAINER_ATTENTION_SIMPLE=1 routes BF16/F16 through the fp32 simple kernels.
bool force_simple() {
  static const bool on = [] {
    const char* e = std::getenv("TRAINER_ATTENTION_SIMPLE");
    return e != nullptr && *e != '\0' && std::string(e) != "0";
  }();
  return on;
}

// delta [B, Hq, T] F32 for the backward (step 1), a few MB.
DeltaScratch delta_scratch("attention delta scratch");

template <typename T, int D>
void forward_simple(const Dims& d, T* out, float* lse, const T* q, const T* k, const T* v,
                    const int32_t* doc, bool causal, int win, const std::string& ctx) {
  constexpr size_t smem = FwdTileSmem<D>::bytes(false);
  const bool docs = doc != nullptr;
  auto kernel = simple_fwd_kernel<T, D>;
  if (docs) kernel = simple_fwd_docs_kernel<T, D>;
  const char* name = docs ? "simple_fwd_docs_kernel" : "simple_fwd_kernel";
  allow_smem_of_pair<simple_fwd_kernel<T, D>, simple_fwd_docs_kernel<T, D>>(docs, smem, name);
  const dim3 grid(unsigned((d.T + kTileRows - 1) / kTileRows), unsigned(d.Hq), unsigned(d.B));
  launch(kernel, grid, kTileThreads, smem, stream(), out, lse, q, k, v, doc, int(d.T), int(d.Hq),
         int(d.Hkv), softmax_scale(D), causal, win);
  KERNEL_CHECK(name, ctx);
}

template <typename T, int D>
void forward_mma(const Dims& d, T* out, float* lse, const T* q, const T* k, const T* v,
                 const int32_t* doc, bool causal, int win, const std::string& ctx) {
  constexpr size_t smem = fwd_smem_bytes<T, D>();
  const bool docs = doc != nullptr;
  auto kernel = flash_fwd_kernel<T, D>;
  if (docs) kernel = flash_fwd_docs_kernel<T, D>;
  const char* name = docs ? "flash_fwd_docs_kernel" : "flash_fwd_kernel";
  allow_smem_of_pair<flash_fwd_kernel<T, D>, flash_fwd_docs_kernel<T, D>>(docs, smem, name);
  constexpr int Br = FwdTiles<D>::Br;
  const dim3 grid(unsigned((d.T + Br - 1) / Br), unsigned(d.Hq), unsigned(d.B));
  launch(kernel, grid, kThreads, smem, stream(), out, lse, q, k, v, doc, int(d.T), int(d.Hq),
         int(d.Hkv), softmax_scale(D) * kLog2e, causal, win);
  KERNEL_CHECK(name, ctx);
}

template <typename T, int D>
void backward_simple(const Dims& d, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                     const T* v, const float* lse, const float* delta, const int32_t* doc, bool causal,
                     int win, const std::string& ctx) {
  const float scale = softmax_scale(D);
  {
    constexpr size_t smem = DkvTileSmem<D>::bytes(false);
    const bool docs = doc != nullptr;
    auto kernel = simple_bwd_dkdv_kernel<T, D>;
    if (docs) kernel = simple_bwd_dkdv_docs_kernel<T, D>;
    const char* name = docs ? "simple_bwd_dkdv_docs_kernel" : "simple_bwd_dkdv_kernel";
    allow_smem_of_pair<simple_bwd_dkdv_kernel<T, D>, simple_bwd_dkdv_docs_kernel<T, D>>(docs, smem,
                                                                                        name);
    const dim3 grid(unsigned((d.T + kTileKeys - 1) / kTileKeys), unsigned(d.Hkv), unsigned(d.B));
    launch(kernel, grid, kTileThreads, smem, stream(), dk, dv, q, k, v, dout, lse, delta, doc,
           int(d.T), int(d.Hq), int(d.Hkv), scale, causal, win);
    KERNEL_CHECK(name, ctx);
  }
  {
    constexpr size_t smem = DqTileSmem<D>::bytes(false);
    const bool docs = doc != nullptr;
    auto kernel = simple_bwd_dq_kernel<T, D>;
    if (docs) kernel = simple_bwd_dq_docs_kernel<T, D>;
    const char* name = docs ? "simple_bwd_dq_docs_kernel" : "simple_bwd_dq_kernel";
    allow_smem_of_pair<simple_bwd_dq_kernel<T, D>, simple_bwd_dq_docs_kernel<T, D>>(docs, smem, name);
    const dim3 grid(unsigned((d.T + kTileRows - 1) / kTileRows), unsigned(d.Hq), unsigned(d.B));
    launch(kernel, grid, kTileThreads, smem, stream(), dq, q, k, v, dout, lse, delta, doc, int(d.T),
           int(d.Hq), int(d.Hkv), scale, causal, win);
    KERNEL_CHECK(name, ctx);
  }
}

template <typename T, int D>
void backward_mma(const Dims& d, T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k,
                  const T* v, const float* lse, const float* delta, const int32_t* doc, bool causal,
                  int win, const std::string& ctx) {
  const float scale = softmax_scale(D);
  {
    const size_t smem = dkdv_smem_bytes<T, D>(doc != nullptr);
    const bool docs = doc != nullptr;
    auto kernel = flash_bwd_dkdv_kernel<T, D>;
    if (docs) kernel = flash_bwd_dkdv_docs_kernel<T, D>;
    const char* name = docs ? "flash_bwd_dkdv_docs_kernel" : "flash_bwd_dkdv_kernel";
    allow_smem_of_pair<flash_bwd_dkdv_kernel<T, D>, flash_bwd_dkdv_docs_kernel<T, D>>(docs, smem, name);
    constexpr int Bc = DkvTiles<D>::Bc;
    const dim3 grid(unsigned((d.T + Bc - 1) / Bc), unsigned(d.Hkv), unsigned(d.B));
    launch(kernel, grid, kThreads, smem, stream(), dk, dv, q, k, v, dout, lse, delta, doc, int(d.T),
           int(d.Hq), int(d.Hkv), scale, scale * kLog2e, causal, win);
    KERNEL_CHECK(name, ctx);
  }
  {
    constexpr size_t smem = dq_smem_bytes<T, D>();
    const bool docs = doc != nullptr;
    auto kernel = flash_bwd_dq_kernel<T, D>;
    if (docs) kernel = flash_bwd_dq_docs_kernel<T, D>;
    const char* name = docs ? "flash_bwd_dq_docs_kernel" : "flash_bwd_dq_kernel";
    allow_smem_of_pair<flash_bwd_dq_kernel<T, D>, flash_bwd_dq_docs_kernel<T, D>>(docs, smem, name);
    constexpr int Br = DqTiles<D>::Br;
    const dim3 grid(unsigned((d.T + Br - 1) / Br), unsigned(d.Hq), unsigned(d.B));
    launch(kernel, grid, kThreads, smem, stream(), dq, q, k, v, dout, lse, delta, doc, int(d.T),
           int(d.Hq), int(d.Hkv), scale, scale * kLog2e, causal, win);
    KERNEL_CHECK(name, ctx);
  }
}

template <typename T>
void forward_typed(const Dims& d, Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v,
                   const int32_t* doc, bool causal, int win, const std::string& ctx) {
  T* o = static_cast<T*>(out.data);
  float* l = static_cast<float*>(lse.data);
  const T* qp = static_cast<const T*>(q.data);
  const T* kp = static_cast<const T*>(k.data);
  const T* vp = static_cast<const T*>(v.data);
  bool simple = true;
  if constexpr (!std::is_same_v<T, float>) simple = force_simple();
  if (simple) {
    with_head_dim(d.D, [&]<int kD>() {
      forward_simple<T, kD>(d, o, l, qp, kp, vp, doc, causal, win, ctx);
    });
    return;
  }
  if constexpr (!std::is_same_v<T, float>) {
    const char* op = "attention_forward";
    need_aligned(op, "out", out);
    need_aligned(op, "q", q);
    need_aligned(op, "k", k);
    need_aligned(op, "v", v);
    with_head_dim(d.D, [&]<int kD>() {
      forward_mma<T, kD>(d, o, l, qp, kp, vp, doc, causal, win, ctx);
    });
  }
}

template <typename T>
void backward_typed(const Dims& d, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                    Tensor v, Tensor out, Tensor lse, const int32_t* doc, bool causal, int win,
                    const std::string& ctx) {
  T* dqp = static_cast<T*>(dq.data);
  T* dkp = static_cast<T*>(dk.data);
  T* dvp = static_cast<T*>(dv.data);
  const T* gp = static_cast<const T*>(dout.data);
  const T* qp = static_cast<const T*>(q.data);
  const T* kp = static_cast<const T*>(k.data);
  const T* vp = static_cast<const T*>(v.data);
  const T* op_ = static_cast<const T*>(out.data);
  const float* l = static_cast<const float*>(lse.data);

  // (1) delta = rowsum(dout * out), [B, Hq, T].
  const int64_t rows = d.B * d.T * d.Hq;
  float* delta = delta_scratch.get(size_t(rows));
  launch_delta<T>(delta, op_, gp, rows, d.T, d.Hq, d.D, ctx);

  // (2) dK, dV and (3) dQ.
  bool simple = true;
  if constexpr (!std::is_same_v<T, float>) simple = force_simple();
  if (simple) {
    with_head_dim(d.D, [&]<int kD>() {
      backward_simple<T, kD>(d, dqp, dkp, dvp, gp, qp, kp, vp, l, delta, doc, causal, win, ctx);
    });
    return;
  }
  if constexpr (!std::is_same_v<T, float>) {
    const char* op = "attention_backward";
    need_aligned(op, "dq", dq);
    need_aligned(op, "dk", dk);
    need_aligned(op, "dv", dv);
    need_aligned(op, "dout", dout);
    need_aligned(op, "q", q);
    need_aligned(op, "k", k);
    need_aligned(op, "v", v);
    with_head_dim(d.D, [&]<int kD>() {
      backward_mma<T, kD>(d, dqp, dkp, dvp, gp, qp, kp, vp, l, delta, doc, causal, win, ctx);
    });
  }
}

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, int64_t window,
                       Tensor doc_start) {
  const char* op = "attention_forward";
  const Dims d = check_qkv(op, q, k, v);
  same_dtype(op, "out", out, "q", q);
  if (d.B == 0 || d.T == 0 || d.Hq == 0) return;
  const std::string ctx = context(q, k, causal, window, doc_start);
  const int win = kernel_window(causal, window);
  const int32_t* doc = kernel_doc_start(doc_start);
  DISPATCH_FLOAT(q.dtype, T, op, forward_typed<T>(d, out, lse, q, k, v, doc, causal, win, ctx));
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                        Tensor out, Tensor lse, bool causal, int64_t window, Tensor doc_start) {
  const char* op = "attention_backward";
  const Dims d = check_qkv(op, q, k, v);
  same_dtype(op, "out", out, "q", q);
  same_dtype(op, "dout", dout, "q", q);
  same_dtype(op, "dq", dq, "q", q);
  same_dtype(op, "dk", dk, "q", q);
  same_dtype(op, "dv", dv, "q", q);
  if (d.B == 0 || d.T == 0 || d.Hq == 0) return;
  const std::string ctx = context(q, k, causal, window, doc_start);
  const int win = kernel_window(causal, window);
  const int32_t* doc = kernel_doc_start(doc_start);
  DISPATCH_FLOAT(q.dtype, T, op,
                 backward_typed<T>(d, dq, dk, dv, dout, q, k, v, out, lse, doc, causal, win, ctx));
}

}  // namespace trainer::cuda
