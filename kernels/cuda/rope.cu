// Rotary position embedding of the CUDA backend (see kernels/op_list.h),
// half-split convention: the pair (x[i], x[i + D/2]) of every head at
// position p = pos_offset + t turns by angle p * inv_freq[i]; backward turns
// by -angle (the rotation is orthogonal, so its gradient is the inverse
// rotation). inv_freq is the CPU twin's: the same host function
// (kernels/rope_freqs.h: theta^(-2i/D) or its scaling) in double, copied to
// the device once per distinct frequency list and kept for the process.
//
// The angles' cos and sin come from a table [P, D/2] of float2 for positions
// 0..P-1, P = pos_offset + T (the positions a call uses), built once per
// (P, inv_freq) and kept for the process: entry (p, i) depends on p and
// inv_freq[i] only, so a chunk at an offset reads the very values the whole
// sequence does. Each entry is computed in
// double and rounded once to float, as the CPU twin does (an fp32 angle
// t * inv_freq is off by ~1e-4 rad at t in the thousands), so the table
// costs one double sincos per (t, i) once, not per element and step.
//
// rope_forward_pos / rope_backward_pos (explicit positions, a context-parallel
// rank's zigzag chunks) fill a per-call table [T, D/2] for their positions
// with the same entry function (rope_cos_sin) and run the same rotation
// kernel on it, so they give bit for bit what rope_forward gives at an offset.
//
// One thread per (b, t, i) reads its table entry and walks the H heads.
// Consecutive threads take consecutive i, so each head's loads and stores
// are coalesced. A thread reads both elements of a pair before writing
// either, so out may alias inp.
// Bytes: 2 * numel * s (one read, one write) plus 8 bytes of table per
// (b, t, i) (from L2); FLOPs: 6 per pair.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kernels/checks/check_util.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace trainer::cuda {
namespace {

using checks::fail;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;
constexpr int kHeadBatch = 4;  // heads loaded before any is stored: loads in flight

// (cos, sin) of pair i at position p, rounded once to float. Every table
// entry, whichever kernel fills it, comes from here; the product is
// explicitly rounded (__dmul_rn: never contracted into an FMA), so a
// position gets the same bits in every table.
__device__ __forceinline__ float2 rope_cos_sin(int64_t p, double inv_freq) {
  double sd, cd;
  sincos(__dmul_rn(double(p), inv_freq), &sd, &cd);
  return make_float2(float(cd), float(sd));
}

__global__ void __launch_bounds__(kThreads)
    rope_table_kernel(float2* table, int64_t P, int64_t half, const double* __restrict__ inv_freq) {
  const int64_t total = P * half;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half;
    const int64_t i = idx - t * half;
    table[idx] = rope_cos_sin(t, inv_freq[i]);
  }
}

// The table of the positions pos[0..T) (rope_forward_pos): entry (t, i) is
// entry (pos[t], i) of rope_table_kernel's table.
__global__ void __launch_bounds__(kThreads)
    rope_pos_table_kernel(float2* table, const int32_t* __restrict__ pos, int64_t T_len,
                          int64_t half, const double* __restrict__ inv_freq) {
  const int64_t total = T_len * half;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half;
    const int64_t i = idx - t * half;
    table[idx] = rope_cos_sin(int64_t(pos[t]), inv_freq[i]);
  }
}

// The frequencies on the device, one copy per distinct list (a run has one),
// uploaded on first use and kept until the process ends. The copy is waited
// for: it happens once, and the host vector need not outlive the call.
const double* device_inv_freq(const std::vector<double>& inv_freq, const std::string& context) {
  static std::mutex mu;
  static auto* lists = new std::map<std::vector<double>, double*>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  auto it = lists->find(inv_freq);
  if (it != lists->end()) return it->second;
  double* d = nullptr;
  const size_t bytes = inv_freq.size() * sizeof(double);
  CUDA_CHECK(cudaMalloc(&d, bytes), "rope: " + std::to_string(bytes) + " bytes of frequencies for " + context);
  CUDA_CHECK(cudaMemcpyAsync(d, inv_freq.data(), bytes, cudaMemcpyHostToDevice, stream()),
             "rope: uploading the frequencies for " + context);
  CUDA_CHECK(cudaStreamSynchronize(stream()), "rope: uploading the frequencies for " + context);
  lists->emplace(inv_freq, d);
  return d;
}

// The table of positions [0, P) for these frequencies, built on the compute
// stream on first use (kernels queued after it see it); kept until the
// process ends.
const float2* rope_table(int64_t P, const std::vector<double>& inv_freq, const std::string& context) {
  static std::mutex mu;
  static auto* tables = new std::map<std::pair<int64_t, std::vector<double>>, float2*>();  // never freed
  const auto key = std::make_pair(P, inv_freq);
  const double* freq = device_inv_freq(inv_freq, context);
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables->find(key);
  if (it != tables->end()) return it->second;
  const int64_t half = int64_t(inv_freq.size());
  float2* table = nullptr;
  const size_t bytes = size_t(P * half) * sizeof(float2);
  CUDA_CHECK(cudaMalloc(&table, bytes), "rope: cos/sin table of " + std::to_string(bytes) + " bytes for " + context);
  const int64_t blocks = std::min((P * half + kThreads - 1) / kThreads, kMaxBlocks);
  launch(rope_table_kernel, unsigned(blocks), kThreads, 0, stream(), table, P, half, freq);
  KERNEL_CHECK("rope_table_kernel", "rope: cos/sin table for " + context);
  tables->emplace(key, table);
  return table;
}

// Scratch for rope_forward_pos's per-call table [T, D/2] of float2. Grow-only:
// allocated on first use and reallocated only for a larger shape (steady-state
// training never calls cudaMalloc); outside the arenas, T * D/2 * 8 bytes.
// Calls are ordered on cuda::stream(), so a call's table kernel runs after the
// previous call's rotation has read the old contents; a queued kernel may
// still read the old buffer when it grows, so the stream is drained first.
float2* pos_table_scratch(size_t n, const std::string& context) {
  static std::mutex mu;
  static float2* buf = nullptr;
  static size_t cap = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (n > cap) {
    if (buf != nullptr) {
      CUDA_CHECK(cudaStreamSynchronize(stream()), "rope: growing the position table for " + context);
      CUDA_CHECK(cudaFree(buf), "rope: position table");
      buf = nullptr;
      cap = 0;
    }
    CUDA_CHECK(cudaMalloc(&buf, n * sizeof(float2)),
               "rope: position table of " + std::to_string(n * sizeof(float2)) + " bytes for " + context);
    cap = n;
  }
  return buf;
}

// sign = +1 rotates forward, -1 applies the inverse rotation.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(T* out, const T* inp, const float2* __restrict__ table, int64_t BT, int64_t T_len,
                int64_t pos_offset, int64_t H, int64_t half, float sign) {
  const int64_t total = BT * half;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t D = 2 * half;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += stride) {
    const int64_t bt = idx / half;
    const int64_t i = idx - bt * half;
    const int64_t p = pos_offset + bt % T_len;
    const float2 cs = table[p * half + i];
    const float c = cs.x;
    const float s = sign * cs.y;
    const int64_t base = bt * H * D + i;
    for (int64_t h0 = 0; h0 < H; h0 += kHeadBatch) {
      float x0[kHeadBatch], x1[kHeadBatch];
#pragma unroll
      for (int j = 0; j < kHeadBatch; ++j) {
        if (h0 + j < H) {
          const int64_t off = base + (h0 + j) * D;
          x0[j] = to_float(inp[off]);
          x1[j] = to_float(inp[off + half]);
        }
      }
#pragma unroll
      for (int j = 0; j < kHeadBatch; ++j) {
        if (h0 + j < H) {
          const int64_t off = base + (h0 + j) * D;
          out[off] = from_float<T>(x0[j] * c - x1[j] * s);
          out[off + half] = from_float<T>(x0[j] * s + x1[j] * c);
        }
      }
    }
  }
}

// Row t is at position pos_offset + t (pos == nullptr: the shared table of
// positions [0, pos_offset + T)), or at pos[t] (a per-call table of those T
// positions; the rotation kernel then reads it at offset 0), or at pos[b, t]
// (pos [B, T], one per token: a table of B T rows, read at row b T + t, which
// the kernel's row index modulo B T is).
void rotate(const char* op, const char* out_name, Tensor out, const char* inp_name, Tensor inp,
            const Rope& rope, int64_t pos_offset, const Tensor* pos, float sign) {
  // Shapes and the frequencies arrive checked by the router (kernels/checks/rope.cpp).
  if (out.dtype != inp.dtype)
    fail(op, std::string(out_name) + " is " + dtype_name(out.dtype) + " but " + inp_name + " is " +
                 dtype_name(inp.dtype) + ": one storage type per call");
  const int64_t B = inp.dim(0), T_len = inp.dim(1), H = inp.dim(2), half = inp.dim(3) / 2;
  const int64_t total = B * T_len * half;
  if (total == 0 || H == 0) return;
  const int64_t blocks = std::min((total + kThreads - 1) / kThreads, kMaxBlocks);
  const std::vector<double> inv_freq = ops::rope_inv_freqs(inp.dim(3), rope);
  const float2* table = nullptr;
  std::string context;
  if (pos == nullptr) {
    context = std::string(inp_name) + " " + dtype_name(inp.dtype) + inp.shape_str() +
              " at positions " + std::to_string(pos_offset) + ".." +
              std::to_string(pos_offset + T_len - 1);
    table = rope_table(pos_offset + T_len, inv_freq, std::string(op) + " " + context);
  } else {
    context = std::string(inp_name) + " " + dtype_name(inp.dtype) + inp.shape_str() +
              " at positions pos " + pos->shape_str();
    const double* freq = device_inv_freq(inv_freq, std::string(op) + " " + context);
    const int64_t rows = pos->ndim == 2 ? B * T_len : T_len;
    float2* t = pos_table_scratch(size_t(rows * half), std::string(op) + " " + context);
    const int64_t tblocks = std::min((rows * half + kThreads - 1) / kThreads, kMaxBlocks);
    launch(rope_pos_table_kernel, unsigned(tblocks), kThreads, 0, stream(), t, static_cast<const int32_t*>(pos->data),
           rows, half, freq);
    KERNEL_CHECK("rope_pos_table_kernel", std::string(op) + " " + context);
    table = t;
    pos_offset = 0;
  }
  // The kernel's row of the table: pos_offset + (token row modulo `period`).
  const int64_t period = pos != nullptr && pos->ndim == 2 ? B * T_len : T_len;
  DISPATCH_FLOAT(inp.dtype, T, op, {
    launch(rope_kernel<T>, unsigned(blocks), kThreads, 0, stream(), static_cast<T*>(out.data),
           static_cast<const T*>(inp.data), table, B * T_len, period, pos_offset, H, half, sign);
    KERNEL_CHECK("rope_kernel", std::string(op) + " " + context);
  });
}

}  // namespace

void rope_forward(Tensor out, Tensor inp, const Rope& rope, int64_t pos_offset) {
  rotate("rope_forward", "out", out, "inp", inp, rope, pos_offset, nullptr, 1.f);
}

void rope_backward(Tensor dinp, Tensor dout, const Rope& rope, int64_t pos_offset) {
  rotate("rope_backward", "dinp", dinp, "dout", dout, rope, pos_offset, nullptr, -1.f);
}

void rope_forward_pos(Tensor out, Tensor inp, const Rope& rope, Tensor pos) {
  rotate("rope_forward_pos", "out", out, "inp", inp, rope, 0, &pos, 1.f);
}

void rope_backward_pos(Tensor dinp, Tensor dout, const Rope& rope, Tensor pos) {
  rotate("rope_backward_pos", "dinp", dinp, "dout", dout, rope, 0, &pos, -1.f);
}

}  // namespace trainer::cuda
