// The fp32 tiled attention kernels' shared pieces: attention.cu's simple path
// (F32 storage, or TRAINER_ATTENTION_SIMPLE=1) and attention_positions.cu's
// ring-attention kernels are built from the same tiles, so their
// shared-memory layouts, the steps every such kernel takes (dot products,
// online softmax, the products with V / Q / dO / K, the stores), the
// backward's delta and its scratch, and the host's launch set-up live here
// once. What stays in each kernel is its own: which tiles it visits and
// which scores it masks.
//
// 256 threads (8 warps), tiles of 32 query rows x 32 keys in fp32 shared
// memory. Scores: thread (warp w, lane c) computes rows w, w+8, w+16, w+24
// against key c (Q/K/V/dO rows padded to D + 1 floats, so the 32 lanes hit
// 32 banks). Products: each thread owns 32*D/256 output elements (row or
// key e / D, column e % D) and sums in a fixed order: no atomics, the same
// bits run to run.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace trainer::cuda::attention_tiles {

constexpr int kTileThreads = 256;  // 8 warps
constexpr int kTileRows = 32;      // query rows per tile
constexpr int kTileKeys = 32;      // keys per tile
static_assert(kTileRows == 32 && kTileKeys == 32, "one lane per row / key of a tile");

// Every attention kernel's shared memory must fit the 99 KiB opt-in limit of
// sm_86/sm_89 too.
constexpr size_t kMaxSmem = 99 * 1024;

// Output elements each thread owns in a tile's product (32 rows or keys x D).
template <int D> constexpr int tile_per_thread() { return kTileRows * D / kTileThreads; }

// ---- shared-memory layouts ----------------------------------------------------
// Each kernel's tiles in order, floats first; with positions (ring attention)
// the tile's query and key positions follow as ints (Qp, Kp: only a kernel
// launched with bytes(true) may touch them). bytes(positions) is the
// dynamic shared memory to launch with.

// Forward: Q, K, V; the scores (then probabilities); per row the running max,
// the running sum and this tile's rescale factor.
template <int D> struct FwdTileSmem {
  static constexpr int LDF = D + 1, LDS = kTileKeys + 1;
  static constexpr size_t bytes(bool positions) {
    return (size_t(kTileRows + 2 * kTileKeys) * LDF + size_t(kTileRows) * LDS + 3 * kTileRows) *
               sizeof(float) +
           (positions ? size_t(kTileRows + kTileKeys) * sizeof(int) : 0);
  }
  float *Qs, *Ks, *Vs, *Ss, *Ms, *Ls, *As;
  int *Qp, *Kp;
  __device__ explicit FwdTileSmem(unsigned char* raw) {
    Qs = reinterpret_cast<float*>(raw);  // [kTileRows][LDF]
    Ks = Qs + kTileRows * LDF;            // [kTileKeys][LDF]
    Vs = Ks + kTileKeys * LDF;            // [kTileKeys][LDF]
    Ss = Vs + kTileKeys * LDF;            // [kTileRows][LDS]
    Ms = Ss + kTileRows * LDS;            // [kTileRows]
    Ls = Ms + kTileRows;                  // [kTileRows]
    As = Ls + kTileRows;                  // [kTileRows]
    Qp = reinterpret_cast<int*>(As + kTileRows);  // [kTileRows]
    Kp = Qp + kTileRows;                          // [kTileKeys]
  }
};

// dK/dV: K, V (the block's own keys), Q, dO; P and dS; per row lse and delta.
template <int D> struct DkvTileSmem {
  static constexpr int LDF = D + 1, LDS = kTileKeys + 1;
  static constexpr size_t bytes(bool positions) {
    return (size_t(2 * kTileRows + 2 * kTileKeys) * LDF + size_t(2 * kTileRows) * LDS +
            2 * kTileRows) *
               sizeof(float) +
           (positions ? size_t(kTileRows + kTileKeys) * sizeof(int) : 0);
  }
  float *Ks, *Vs, *Qs, *dOs, *Ps, *dSs, *Lr, *Dr;
  int *Qp, *Kp;
  __device__ explicit DkvTileSmem(unsigned char* raw) {
    Ks = reinterpret_cast<float*>(raw);  // [kTileKeys][LDF]
    Vs = Ks + kTileKeys * LDF;            // [kTileKeys][LDF]
    Qs = Vs + kTileKeys * LDF;            // [kTileRows][LDF]
    dOs = Qs + kTileRows * LDF;           // [kTileRows][LDF]
    Ps = dOs + kTileRows * LDF;           // [kTileRows][LDS]
    dSs = Ps + kTileRows * LDS;           // [kTileRows][LDS]
    Lr = dSs + kTileRows * LDS;           // [kTileRows]
    Dr = Lr + kTileRows;                  // [kTileRows]
    Qp = reinterpret_cast<int*>(Dr + kTileRows);  // [kTileRows]
    Kp = Qp + kTileRows;                          // [kTileKeys]
  }
};

// dQ: Q, dO (the block's own rows), K, V; dS; per row lse and delta.
template <int D> struct DqTileSmem {
  static constexpr int LDF = D + 1, LDS = kTileKeys + 1;
  static constexpr size_t bytes(bool positions) {
    return (size_t(2 * kTileRows + 2 * kTileKeys) * LDF + size_t(kTileRows) * LDS +
            2 * kTileRows) *
               sizeof(float) +
           (positions ? size_t(kTileRows + kTileKeys) * sizeof(int) : 0);
  }
  float *Qs, *dOs, *Ks, *Vs, *dSs, *Lr, *Dr;
  int *Qp, *Kp;
  __device__ explicit DqTileSmem(unsigned char* raw) {
    Qs = reinterpret_cast<float*>(raw);  // [kTileRows][LDF]
    dOs = Qs + kTileRows * LDF;           // [kTileRows][LDF]
    Ks = dOs + kTileRows * LDF;           // [kTileKeys][LDF]
    Vs = Ks + kTileKeys * LDF;            // [kTileKeys][LDF]
    dSs = Vs + kTileKeys * LDF;           // [kTileRows][LDS]
    Lr = dSs + kTileRows * LDS;           // [kTileRows]
    Dr = Lr + kTileRows;                  // [kTileRows]
    Qp = reinterpret_cast<int*>(Dr + kTileRows);  // [kTileRows]
    Kp = Qp + kTileRows;                          // [kTileKeys]
  }
};

static_assert(FwdTileSmem<128>::bytes(true) <= kMaxSmem && DkvTileSmem<128>::bytes(true) <= kMaxSmem &&
                  DqTileSmem<128>::bytes(true) <= kMaxSmem,
              "fp32 attention tiles' smem");

// ---- device steps -----------------------------------------------------------------

// 32 rows of D elements of T, global rows `stride` apart -> fp32 smem rows
// of D + 1; rows >= valid are 0.
template <typename T, int D>
__device__ __forceinline__ void load_tile_f32(float* s, const T* g, int64_t stride, int valid) {
  for (int e = threadIdx.x; e < 32 * D; e += kTileThreads) {
    const int r = e / D, d = e % D;
    s[r * (D + 1) + d] = r < valid ? to_float(g[r * stride + d]) : 0.f;
  }
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

template <int D>
__device__ __forceinline__ float dot_rows(const float* a, const float* b) {
  float acc = 0.f;
#pragma unroll 8
  for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
  return acc;
}

// The online softmax over one K tile, a warp per 4 rows: scores become
// e^(x - running max), the rows' running max and sum move on, and As holds
// the factor that rescales what was accumulated before this tile.
template <int D>
__device__ __forceinline__ void online_softmax_tile(const FwdTileSmem<D>& s) {
  constexpr int LDS = FwdTileSmem<D>::LDS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < kTileRows / 8; ++i) {
    const int r = warp * (kTileRows / 8) + i;
    const float x = s.Ss[r * LDS + lane];
    const float m_old = s.Ms[r];
    const float m_new = fmaxf(m_old, warp_max(x));
    const float ref = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: exp(-inf) = 0
    const float p = expf(x - ref);
    const float sum = warp_sum(p);
    s.Ss[r * LDS + lane] = p;
    __syncwarp();
    if (lane == 0) {
      const float alpha = expf(m_old - ref);
      s.Ms[r] = m_new;
      s.Ls[r] = s.Ls[r] * alpha + sum;
      s.As[r] = alpha;
    }
  }
}

// o = o * alpha + P V over the tile's keys (this thread's elements).
template <int D>
__device__ __forceinline__ void accumulate_pv(float (&o)[tile_per_thread<D>()],
                                              const FwdTileSmem<D>& s) {
  constexpr int LDF = FwdTileSmem<D>::LDF, LDS = FwdTileSmem<D>::LDS;
#pragma unroll
  for (int i = 0; i < tile_per_thread<D>(); ++i) {
    const int e = int(threadIdx.x) + kTileThreads * i, r = e / D, d = e % D;
    float acc = o[i] * s.As[r];
#pragma unroll 8
    for (int c = 0; c < kTileKeys; ++c) acc = fmaf(s.Ss[r * LDS + c], s.Vs[c * LDF + d], acc);
    o[i] = acc;
  }
}

// out = o / sum for the tile's rows below Tq (a row whose sum is 0 saw no
// key: 0). out [B, Tq, Hq, D], row stride ldq.
template <typename T, int D>
__device__ __forceinline__ void store_out_tile(T* out, const float (&o)[tile_per_thread<D>()],
                                               const float* Ls, int q0, int Tq, int b, int h,
                                               int64_t ldq) {
#pragma unroll
  for (int i = 0; i < tile_per_thread<D>(); ++i) {
    const int e = int(threadIdx.x) + kTileThreads * i, r = e / D, d = e % D, row = q0 + r;
    if (row < Tq) {
      const float sum = Ls[r];
      out[(int64_t(b) * Tq + row) * ldq + int64_t(h) * D + d] =
          from_float<T>(sum > 0.f ? o[i] / sum : 0.f);
    }
  }
}

// The Q tile's rows' lse and delta ([B, Hq, Tq]) into smem; rows past Tq get
// lse_pad and 0.
__device__ __forceinline__ void load_row_stats(float* Lr, float* Dr, const float* lse,
                                               const float* delta, int b, int h, int Hq, int q0,
                                               int Tq, float lse_pad) {
  const int tid = threadIdx.x;
  if (tid < kTileRows) {
    const int row = q0 + tid;
    const int64_t idx = (int64_t(b) * Hq + h) * Tq + row;
    Lr[tid] = row < Tq ? lse[idx] : lse_pad;
    Dr[tid] = row < Tq ? delta[idx] : 0.f;
  }
}

// dV += P^T dO, dK += dS^T Q over the Q tile's rows (this thread's
// elements of the block's keys; dK without its scale).
template <int D>
__device__ __forceinline__ void accumulate_dkdv(float (&dka)[tile_per_thread<D>()],
                                                float (&dva)[tile_per_thread<D>()],
                                                const DkvTileSmem<D>& s) {
  constexpr int LDF = DkvTileSmem<D>::LDF, LDS = DkvTileSmem<D>::LDS;
#pragma unroll
  for (int i = 0; i < tile_per_thread<D>(); ++i) {
    const int e = int(threadIdx.x) + kTileThreads * i, c = e / D, d = e % D;
    float a = dva[i], bacc = dka[i];
#pragma unroll 8
    for (int r = 0; r < kTileRows; ++r) {
      a = fmaf(s.Ps[r * LDS + c], s.dOs[r * LDF + d], a);
      bacc = fmaf(s.dSs[r * LDS + c], s.Qs[r * LDF + d], bacc);
    }
    dva[i] = a;
    dka[i] = bacc;
  }
}

// dQ += dS K over the K tile's keys (this thread's elements; without the scale).
template <int D>
__device__ __forceinline__ void accumulate_dq(float (&dqa)[tile_per_thread<D>()],
                                              const DqTileSmem<D>& s) {
  constexpr int LDF = DqTileSmem<D>::LDF, LDS = DqTileSmem<D>::LDS;
#pragma unroll
  for (int i = 0; i < tile_per_thread<D>(); ++i) {
    const int e = int(threadIdx.x) + kTileThreads * i, r = e / D, d = e % D;
    float acc = dqa[i];
#pragma unroll 8
    for (int c = 0; c < kTileKeys; ++c) acc = fmaf(s.dSs[r * LDS + c], s.Ks[c * LDF + d], acc);
    dqa[i] = acc;
  }
}

// dk = dka * scale, dv = dva for the block's keys below Tk (kAdd: added to
// the stored values, as ring attention accumulates a block's share).
// dk, dv [B, Tk, Hkv, D], row stride ldk.
template <bool kAdd, typename T, int D>
__device__ __forceinline__ void store_dkdv_tile(T* dk, T* dv, const float (&dka)[tile_per_thread<D>()],
                                                const float (&dva)[tile_per_thread<D>()], int k0,
                                                int Tk, int b, int kvh, int64_t ldk, float scale) {
#pragma unroll
  for (int i = 0; i < tile_per_thread<D>(); ++i) {
    const int e = int(threadIdx.x) + kTileThreads * i, c = e / D, d = e % D, key = k0 + c;
    if (key < Tk) {
      const int64_t idx = (int64_t(b) * Tk + key) * ldk + int64_t(kvh) * D + d;
      if constexpr (kAdd) {
        dk[idx] = from_float<T>(to_float(dk[idx]) + dka[i] * scale);
        dv[idx] = from_float<T>(to_float(dv[idx]) + dva[i]);
      } else {
        dk[idx] = from_float<T>(dka[i] * scale);
        dv[idx] = from_float<T>(dva[i]);
      }
    }
  }
}

// dq = dqa * scale for the tile's rows below Tq (kAdd: added to the stored
// values). dq [B, Tq, Hq, D], row stride ldq.
template <bool kAdd, typename T, int D>
__device__ __forceinline__ void store_dq_tile(T* dq, const float (&dqa)[tile_per_thread<D>()], int q0,
                                              int Tq, int b, int h, int64_t ldq, float scale) {
#pragma unroll
  for (int i = 0; i < tile_per_thread<D>(); ++i) {
    const int e = int(threadIdx.x) + kTileThreads * i, r = e / D, d = e % D, row = q0 + r;
    if (row < Tq) {
      const int64_t idx = (int64_t(b) * Tq + row) * ldq + int64_t(h) * D + d;
      if constexpr (kAdd)
        dq[idx] = from_float<T>(to_float(dq[idx]) + dqa[i] * scale);
      else
        dq[idx] = from_float<T>(dqa[i] * scale);
    }
  }
}

// ---- backward step 1: delta = rowsum(dout * out) ------------------------------------

// One warp per (b, t, h) row; any D, any float storage type; delta [B, Hq, T].
// Used by the tensor-core path too. static: one copy per file that launches it.
constexpr int kDeltaWarps = 8;

template <typename T>
static __global__ void __launch_bounds__(kDeltaWarps * 32)
    attention_delta_kernel(float* __restrict__ delta, const T* __restrict__ out,
                           const T* __restrict__ dout, int64_t rows, int64_t T_len, int64_t Hq,
                           int D) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kDeltaWarps + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together
  const T* o = out + row * D;
  const T* go = dout + row * D;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32) acc += to_float(o[d]) * to_float(go[d]);
  acc = warp_sum(acc);
  if (lane == 0) {
    const int64_t h = row % Hq, bt = row / Hq, t = bt % T_len, b = bt / T_len;
    delta[(b * Hq + h) * T_len + t] = acc;
  }
}

template <typename T>
void launch_delta(float* delta, const T* out, const T* dout, int64_t rows, int64_t T_len,
                  int64_t Hq, int64_t D, const std::string& ctx) {
  launch(attention_delta_kernel<T>, unsigned((rows + kDeltaWarps - 1) / kDeltaWarps),
         kDeltaWarps * 32, 0, stream(), delta, out, dout, rows, T_len, Hq, int(D));
  KERNEL_CHECK("attention_delta_kernel", ctx);
}

// Scratch for delta [B, Hq, T] F32. Grow-only: allocated on first use and
// reallocated only when a larger shape arrives, so steady-state training
// never calls cudaMalloc; B*Hq*T*4 bytes, outside the arenas. Kernels queued
// on cuda::stream() may still read the old buffer, so the stream is drained
// before it is freed. One device per process; never freed (it lives until
// the process ends).
class DeltaScratch {
 public:
  explicit DeltaScratch(const char* name) : name_(name) {}
  float* get(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > cap_) {
      if (buf_ != nullptr) {
        CUDA_CHECK(cudaStreamSynchronize(stream()), std::string(name_) + ": growing");
        CUDA_CHECK(cudaFree(buf_), std::string(name_));
        buf_ = nullptr;
        cap_ = 0;
      }
      CUDA_CHECK(cudaMalloc(&buf_, n * sizeof(float)),
                 std::string(name_) + ": " + std::to_string(n) + " floats");
      cap_ = n;
    }
    return buf_;
  }

 private:
  const char* name_;
  std::mutex mu_;
  float* buf_ = nullptr;
  size_t cap_ = 0;
};

// ---- host: checks and launch set-up ---------------------------------------------

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// One storage type for every float tensor of a call (the kernels are
// templated on it).
inline void same_dtype(const char* op, const char* name, const Tensor& t, const char* like_name,
                       const Tensor& like) {
  if (t.dtype != like.dtype)
    fail(op, std::string(name) + " " + t.shape_str() + " is " + dtype_name(t.dtype) +
                 ", expected " + dtype_name(like.dtype) + " like " + like_name);
}

// The head dims the kernels are built for.
inline void need_head_dim(const char* op, int64_t D) {
  if (D != 32 && D != 64 && D != 128)
    fail(op, "head dim D=" + std::to_string(D) + " is not supported on CUDA (32, 64 or 128)");
}

// f.template operator()<kD>() with the head dim need_head_dim accepted as a
// compile-time constant: the one place the launchers meet the kernels' D.
template <typename F> void with_head_dim(int64_t D, F&& f) {
  if (D == 32) f.template operator()<32>();
  else if (D == 64) f.template operator()<64>();
  else f.template operator()<128>();
}

inline float softmax_scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }

// Opts a kernel into more than 48 KB of dynamic shared memory.
template <typename Kernel>
bool allow_smem(Kernel kernel, size_t bytes, const char* name) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(bytes)),
               std::string(name) + " (" + std::to_string(bytes) + " bytes of shared memory)");
  return true;
}

// allow_smem once per kernel (and device: one device per process here), on
// its first launch.
template <auto kernel>
void allow_smem_once(size_t bytes, const char* name) {
  static const bool ready = allow_smem(kernel, bytes, name);
  (void)ready;
}

// Each attention kernel is two instances of one body: NAME_kernel without
// separate documents, where their masks and tile bounds compile away (a
// model without documents runs the kernel it ran before documents existed,
// registers and all), and NAME_docs_kernel with doc_start. A launch picks
// one (docs: a doc_start was given); this opts that one into `bytes` of
// shared memory, once.
template <auto kPlain, auto kDocs>
void allow_smem_of_pair(bool docs, size_t bytes, const char* name) {
  if (docs)
    allow_smem_once<kDocs>(bytes, name);
  else
    allow_smem_once<kPlain>(bytes, name);
}

}  // namespace trainer::cuda::attention_tiles
