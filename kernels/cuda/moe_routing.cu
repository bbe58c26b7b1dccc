// MoE router and dispatch plan of the CUDA backend; semantics of the moe_*
// routing ops in kernels/op_list.h, matching the CPU reference
// (kernels/cpu/moe_routing.cpp) choice for choice and row for row, so
// GPU-vs-CPU tests can compare routed buffers directly.
//
// Router (moe_route_forward / moe_route_backward): one thread per token, E
// and K being small (tens to hundreds, <= 8). Softmax in double from the
// BF16/F16/F32 logits, as on the CPU, so the stored fp32 probabilities are
// (all but never) bitwise the CPU's and top-k picks the same experts: a
// near-tie that fp32 rounding flipped would route a token differently and make
// every later comparison meaningless. Top-k scans the stored fp32 row in
// ascending index with a strict '>' (ties: lower index), the k-th pick being
// the best one strictly after the (k-1)-th in (prob desc, index asc) order.
// Cost: ~2E double exp + K*E compares per token; reads E logits, writes E
// probs and 2K values.
//
// Router statistics: integer expert counts (int atomics: exact, so
// deterministic), then one 1024-thread block sums the probability columns in
// a fixed order (double). Single block on purpose: reads N*E*4 bytes at one
// SM's bandwidth (tens of microseconds at N*E = 1M), once per MoE layer. The
// aux loss is then E products of the statistics, summed by one thread in
// expert order (the statistics may first be summed over a cp group).
//
// Dispatch plan (moe_dispatch_plan): assignment j = k*N + n in k-major
// order; its rank = number of earlier assignments to the same expert, kept
// iff capacity <= 0 or rank < capacity, row = offsets[e] + rank: the CPU's
// admission order exactly. Parallel and deterministic (integers only):
//   1. per chunk of 256 assignments, rank within the chunk by comparing with
//      the chunk's earlier entries in shared memory (256 compares per thread),
//      and the chunk's count per expert;
//   2. per expert, an exclusive scan of its chunk counts (one block each);
//   3. offsets = exclusive scan of min(count, capacity) (one block);
//   4. row = offsets[e] + chunk base + rank in chunk, or -1.
// Scratch: ceil(N*K/256) * E + E ints (4 MiB at N*K = 1M, E = 256).
//
// Expert ids the CPU validates on the host live on the device here, and
// checking them would cost a sync per call. Instead a bad expert id (outside
// [0, E)) poisons what it touches: the statistics' counts (and so aux) = NaN,
// that token's dlogits row = NaN, and the dispatch plan drops the assignment
// (row -1). Shapes and dtypes
// arrive checked by the router (kernels/checks/moe_routing.cpp).
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
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

using namespace moe_detail;

__device__ __forceinline__ float nan_f() { return __int_as_float(0x7fc00000); }

// ---- router ------------------------------------------------------------------------

template <typename T>
__global__ void route_forward_kernel(float* P, int32_t* I, float* W, const T* L, int64_t N, int E, int K,
                                     bool normalize) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  // P may alias L (F32 logits): every logit is read before its own slot is
  // written, and passes 1-2 only read. Hence no __restrict__.
  const T* l = L + n * E;
  float* p = P + n * E;
  int32_t* idx = I + n * K;
  float* w = W + n * K;
  double mx = double(to_float(l[0]));
  for (int e = 1; e < E; ++e) mx = fmax(mx, double(to_float(l[e])));
  double s = 0;
  for (int e = 0; e < E; ++e) s += exp(double(to_float(l[e])) - mx);
  for (int e = 0; e < E; ++e) p[e] = float(exp(double(to_float(l[e])) - mx) / s);

  // A NaN or +inf logit makes s (and every probability) NaN; the CPU scan
  // then keeps the first untaken index each time: experts 0..K-1.
  const bool nan_row = s != s;
  int prev = -1;
  float prev_p = 0.f;
  double wsum = 0;
  for (int k = 0; k < K; ++k) {
    int best = -1;
    float bp = 0.f;
    if (!nan_row) {
      for (int e = 0; e < E; ++e) {
        const float pe = p[e];
        if (prev >= 0 && !(pe < prev_p || (pe == prev_p && e > prev))) continue;  // not after the previous pick
        if (best < 0 || pe > bp) {
          best = e;
          bp = pe;
        }
      }
    }
    if (best < 0) {  // NaN row (and, defensively, nothing left)
      best = k;
      bp = p[k];
    }
    idx[k] = best;
    wsum += double(bp);
    prev = best;
    prev_p = bp;
  }
  for (int k = 0; k < K; ++k) {
    const double wk = double(p[idx[k]]);
    w[k] = float(normalize ? wk / wsum : wk);
  }
}

// cnt[e] = assignments to expert e; cnt[E] = ids outside [0, E).
__global__ void count_experts_kernel(const int32_t* I, int64_t NK, int E, int* cnt) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < NK; i += int64_t(gridDim.x) * blockDim.x) {
    const int e = I[i];
    atomicAdd(&cnt[(e >= 0 && e < E) ? e : E], 1);
  }
}

constexpr int kStatsThreads = 1024;  // 32 warps; the kernel relies on it

// S[0,e] = cnt[e] (NaN everywhere if an id was bad), S[1,e] = sum_n P[n,e].
// Warp w sums rows w, w+32, ... of 32 adjacent columns (coalesced); the 32
// partials per column are added in warp order.
__global__ void __launch_bounds__(kStatsThreads) router_stats_kernel(float* S, const float* P, const int* cnt,
                                                                     int64_t N, int E) {
  TRAINER_SHARED(double, part, [32][33]);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool bad = cnt[E] != 0;
  for (int c0 = 0; c0 < E; c0 += 32) {
    const int c = c0 + lane;
    double s = 0;
    if (c < E)
      for (int64_t n = warp; n < N; n += 32) s += double(P[n * E + c]);
    part[warp][lane] = s;
    __syncthreads();
    if (warp == 0 && c < E) {
      double pe = 0;
      for (int w = 0; w < 32; ++w) pe += part[w][lane];
      S[c] = bad ? nan_f() : float(cnt[c]);
      S[E + c] = float(pe);
    }
    __syncthreads();
  }
}

// aux = E * sum_e (S[0,e] / NK) * (S[1,e] / tokens), in expert order.
__global__ void aux_loss_kernel(float* aux, const float* S, int E, double tokens, double NK) {
  double total = 0;
  for (int e = 0; e < E; ++e) total += (double(S[e]) / NK) * (double(S[E + e]) / tokens);
  aux[0] = float(double(E) * total);
}

// Per token: dp = daux + d(combine weights)/dp, then the softmax backward
// dl_e = p_e (dp_e - sum_j p_j dp_j), all in double in the CPU's order.
// counts == nullptr: no aux term (else the statistics' first row, over
// `tokens` tokens). DW == nullptr: no combine-weight term.
template <typename T>
__global__ void route_backward_kernel(T* DL, const float* DW, const float* P, const int32_t* I, const float* W,
                                      const float* counts, float aux_grad, int64_t N, int E, int K, double tokens,
                                      bool normalize) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  // DL may alias P (F32): p[e] is read right before dl[e] is written, and the
  // sums below read only the selected probabilities before the write loop.
  const float* p = P + n * E;
  const int32_t* idx = I + n * K;
  T* dl = DL + n * E;
  bool bad = false;
  for (int k = 0; k < K; ++k) bad |= idx[k] < 0 || idx[k] >= E;
  if (bad) {
    for (int e = 0; e < E; ++e) dl[e] = from_float<T>(nan_f());
    return;
  }
  const float* dw = DW ? DW + n * K : nullptr;
  double S = 0, dotw = 0;
  if (dw && normalize)
    for (int k = 0; k < K; ++k) {
      S += double(p[idx[k]]);
      dotw += double(dw[k]) * double(W[n * K + k]);
    }
  // Not stored per expert (no local array of E): recomputed, K work each.
  auto dp = [&](int e) {
    double v = counts ? double(aux_grad) * double(E) * (double(counts[e]) / (tokens * K)) / tokens : 0.0;
    if (dw)
      for (int k = 0; k < K; ++k)
        if (idx[k] == e) v += normalize ? (double(dw[k]) - dotw) / S : double(dw[k]);
    return v;
  };
  double dot = 0;
  for (int e = 0; e < E; ++e) dot += double(p[e]) * dp(e);
  for (int e = 0; e < E; ++e) {
    const double pe = double(p[e]);
    dl[e] = from_float<T>(float(pe * (dp(e) - dot)));
  }
}

// ---- dispatch plan --------------------------------------------------------------------

constexpr int kChunk = 256;  // assignments per block in the rank pass (= its blockDim)

// Assignment j = k*N + n (k-major). R[a] (a = n*K + k) = rank of j within its
// chunk among assignments to the same expert (temporary), -1 for a bad id or
// one not admitted (A, may be null);
// hist[chunk, e] = count of e in the chunk, written by e's last entry.
__global__ void __launch_bounds__(kChunk) dispatch_rank_kernel(const int32_t* I, const int32_t* A, int32_t* R,
                                                               int* hist, int64_t N, int K, int E) {
  TRAINER_SHARED(int, s, [kChunk]);
  const int64_t NK = N * int64_t(K);
  const int64_t j = int64_t(blockIdx.x) * kChunk + threadIdx.x;
  int e = -1;
  int64_t a = -1;
  if (j < NK) {
    const int64_t k = j / N, n = j - k * N;
    a = n * K + k;
    e = I[a];
    if (e < 0 || e >= E || (A && A[a] < 0)) e = -1;
  }
  s[threadIdx.x] = e;
  __syncthreads();
  if (a < 0) return;
  if (e < 0) {
    R[a] = -1;
    return;
  }
  int r = 0;
  bool last = true;
  for (int t = 0; t < kChunk; ++t) {
    if (s[t] != e) continue;
    if (t < int(threadIdx.x))
      ++r;
    else if (t > int(threadIdx.x))
      last = false;
  }
  R[a] = r;
  if (last) hist[int64_t(blockIdx.x) * E + e] = r + 1;
}

constexpr int kScanThreads = 256;

// Block-wide exclusive scan of n ints given by get(i), written by put(i, v),
// in index order; returns the total to every thread. Thread t owns a
// contiguous range, so reads and writes stay in order.
template <typename Get, typename Put>
__device__ int block_exclusive_scan(int64_t n, Get get, Put put) {
  TRAINER_SHARED(int, sums, [kScanThreads]);
  TRAINER_SHARED(int, total);
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t i0 = int64_t(threadIdx.x) * per;
  const int64_t i1 = i0 + per < n ? i0 + per : n;
  int local = 0;
  for (int64_t i = i0; i < i1; ++i) local += get(i);
  sums[threadIdx.x] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    int run = 0;
    for (int t = 0; t < kScanThreads; ++t) {
      const int v = sums[t];
      sums[t] = run;
      run += v;
    }
    total = run;
  }
  __syncthreads();
  int run = sums[threadIdx.x];
  for (int64_t i = i0; i < i1; ++i) {
    const int v = get(i);
    put(i, run);
    run += v;
  }
  return total;
}

// Block e: hist[., e] -> exclusive prefix over chunks; totals[e] = count of e.
__global__ void __launch_bounds__(kScanThreads) dispatch_scan_kernel(int* hist, int64_t chunks, int E, int* totals) {
  const int e = blockIdx.x;
  const int t = block_exclusive_scan(
      chunks, [&](int64_t c) { return hist[c * E + e]; }, [&](int64_t c, int v) { hist[c * E + e] = v; });
  if (threadIdx.x == 0) totals[e] = t;
}

__global__ void __launch_bounds__(kScanThreads) dispatch_offsets_kernel(const int* totals, int E, int capacity,
                                                                        int32_t* offsets) {
  auto kept = [&](int64_t e) {
    const int v = totals[e];
    return capacity > 0 && v > capacity ? capacity : v;
  };
  block_exclusive_scan(E, kept, [&](int64_t e, int v) { offsets[e + 1] = v + kept(e); });
  if (threadIdx.x == 0) offsets[0] = 0;
}

__global__ void dispatch_finalize_kernel(const int32_t* I, const int32_t* A, int32_t* R, const int* hist,
                                         const int32_t* offsets, int64_t N, int K, int E, int capacity) {
  const int64_t NK = N * int64_t(K);
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < NK; j += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = j / N, n = j - k * N, a = n * K + k;
    const int e = I[a];
    if (e < 0 || e >= E || (A && A[a] < 0)) continue;  // already -1
    const int rank = hist[(j / kChunk) * E + e] + R[a];
    R[a] = (capacity <= 0 || rank < capacity) ? offsets[e] + rank : -1;
  }
}

}  // namespace

// ---- router ops ------------------------------------------------------------------------

void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool normalize) {
  const char* op = "moe_route_forward";
  const int64_t N = logits.dim(0), E = logits.dim(1), K = topk_idx.dim(1);
  if (E > INT_MAX) fail(op, "logits " + logits.shape_str() + " has too many experts");
  if (N == 0) return;
  const unsigned blocks = unsigned((N + 127) / 128);
  DISPATCH_FLOAT(logits.dtype, T, op, {
    launch(route_forward_kernel<T>, blocks, 128, 0, stream(), probs.f32(), topk_idx.i32(), topk_w.f32(),
           static_cast<const T*>(logits.data), N, int(E), int(K), normalize);
    KERNEL_CHECK("route_forward_kernel", std::string(op) + ": logits " + logits.shape_str() + " " +
                                             dtype_name(logits.dtype) + ", topk_idx " + topk_idx.shape_str());
  });
}

void moe_router_stats(Tensor stats, Tensor probs, Tensor topk_idx) {
  const char* op = "moe_router_stats";
  const int64_t N = probs.dim(0), E = probs.dim(1), NK = topk_idx.numel();
  if (E < 1 || E > INT_MAX) fail(op, "probs " + probs.shape_str() + " must have 1 to 2^31 - 1 experts");
  const std::string ctx = std::string(op) + ": probs " + probs.shape_str() + ", topk_idx " + topk_idx.shape_str();
  std::lock_guard<std::mutex> lock(scratch_mutex());
  int* cnt = static_cast<int*>(scratch(size_t(E + 1) * sizeof(int), op));
  CUDA_CHECK(cudaMemsetAsync(cnt, 0, size_t(E + 1) * sizeof(int), stream()), ctx);
  if (NK > 0) {
    launch(count_experts_kernel, blocks_for(NK, kThreads), kThreads, 0, stream(), topk_idx.i32(), NK, int(E), cnt);
    KERNEL_CHECK("count_experts_kernel", ctx);
  }
  launch(router_stats_kernel, 1, kStatsThreads, 0, stream(), stats.f32(), probs.f32(), cnt, N, int(E));
  KERNEL_CHECK("router_stats_kernel", ctx);
}

void moe_aux_loss_forward(Tensor aux, Tensor stats, int tokens, int topk) {
  const char* op = "moe_aux_loss_forward";
  const int64_t E = stats.dim(1);
  if (E > INT_MAX) fail(op, "stats " + stats.shape_str() + " has too many experts");
  const std::string ctx = std::string(op) + ": stats " + stats.shape_str() + ", tokens " + std::to_string(tokens);
  // No tokens: every f_e is 0, so is the loss (as on the CPU).
  if (tokens == 0) {
    CUDA_CHECK(cudaMemsetAsync(aux.data, 0, sizeof(float), stream()), ctx);
    return;
  }
  launch(aux_loss_kernel, 1, 1, 0, stream(), aux.f32(), stats.f32(), int(E), double(tokens),
         double(tokens) * double(topk));
  KERNEL_CHECK("aux_loss_kernel", ctx);
}

void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor topk_w, bool normalize,
                        float aux_grad, Tensor stats, int tokens) {
  const char* op = "moe_route_backward";
  // An absent dtopk_w: only the aux loss drives the router.
  const bool have_dw = !dtopk_w.empty();
  const int64_t N = probs.dim(0), E = probs.dim(1), K = topk_idx.dim(1);
  if (E > INT_MAX || K > INT_MAX) fail(op, "probs " + probs.shape_str() + " or topk_idx " + topk_idx.shape_str() + " is too large");
  if (N == 0) return;
  const std::string ctx = std::string(op) + ": dlogits " + dlogits.shape_str() + " " + dtype_name(dlogits.dtype) +
                          ", topk_idx " + topk_idx.shape_str();
  // No aux term without a gradient for it or tokens to spread it over (the CPU's too).
  const float* counts = aux_grad != 0.f && tokens > 0 && K > 0 ? stats.f32() : nullptr;
  const unsigned blocks = unsigned((N + 127) / 128);
  DISPATCH_FLOAT(dlogits.dtype, T, op, {
    launch(route_backward_kernel<T>, blocks, 128, 0, stream(), static_cast<T*>(dlogits.data),
           have_dw ? dtopk_w.f32() : nullptr, probs.f32(), topk_idx.i32(), topk_w.f32(), counts, aux_grad, N, int(E),
           int(K), double(tokens), normalize);
    KERNEL_CHECK("route_backward_kernel", ctx);
  });
}

// ---- dispatch plan ------------------------------------------------------------------------

void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts, int capacity,
                       Tensor admitted) {
  const char* op = "moe_dispatch_plan";
  const int64_t E = num_experts, N = topk_idx.dim(0), K = topk_idx.dim(1), NK = N * K;
  const std::string ctx = std::string(op) + ": topk_idx " + topk_idx.shape_str() + ", E = " + std::to_string(E) +
                          ", capacity " + std::to_string(capacity);
  if (NK == 0) {
    CUDA_CHECK(cudaMemsetAsync(offsets.data, 0, size_t(E + 1) * sizeof(int32_t), stream()), ctx);
    return;
  }
  const int64_t chunks = (NK + kChunk - 1) / kChunk;
  std::lock_guard<std::mutex> lock(scratch_mutex());
  int* hist = static_cast<int*>(scratch(size_t(chunks * E + E) * sizeof(int), op));
  int* totals = hist + chunks * E;
  CUDA_CHECK(cudaMemsetAsync(hist, 0, size_t(chunks * E) * sizeof(int), stream()), ctx);
  const int32_t* A = admitted.empty() ? nullptr : admitted.i32();
  launch(dispatch_rank_kernel, unsigned(chunks), kChunk, 0, stream(), topk_idx.i32(), A, row_map.i32(), hist, N, int(K),
         int(E));
  KERNEL_CHECK("dispatch_rank_kernel", ctx);
  launch(dispatch_scan_kernel, unsigned(E), kScanThreads, 0, stream(), hist, chunks, int(E), totals);
  KERNEL_CHECK("dispatch_scan_kernel", ctx);
  launch(dispatch_offsets_kernel, 1, kScanThreads, 0, stream(), totals, int(E), capacity, offsets.i32());
  KERNEL_CHECK("dispatch_offsets_kernel", ctx);
  launch(dispatch_finalize_kernel, blocks_for(NK, kThreads), kThreads, 0, stream(), topk_idx.i32(), A, row_map.i32(),
         hist, offsets.i32(), N, int(K), int(E), capacity);
  KERNEL_CHECK("dispatch_finalize_kernel", ctx);
}

}  // namespace trainer::cuda
