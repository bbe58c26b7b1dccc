// Kernel benchmarks of the CUDA backend, called through kernels/ops.h exactly
// as the model calls them, against the device's two ceilings (a cuBLASLt
// GEMM and a device-to-device copy). scripts/bench_gpu_torch.py does the same
// work through PyTorch with the same names and shapes; scripts/gpu-check.sh
// prints the two side by side.
//
//   bench_kernels [--json FILE] [--reps N] [--warmup N] [--only SUBSTRING] [--quick]
//
// Each measurement prints one line
//   RESULT impl=ours name=attn_fwd seq=4096 d=128 ... ms=0.123 tflops=456.7
// and, with --json, the file is rewritten after every measurement, so a run
// cut short still leaves what it measured.
//
// Method:
// - inputs are random (never zeros: they hide unwritten outputs and run
//   faster than real data);
// - outputs are poisoned with NaN bytes, the op runs once untimed and every
//   output element is checked to be finite (unwritten elements stay NaN);
// - warm-up calls, then the median of N calls, each timed by cudaEvents on
//   the ops' stream;
// - memory-bound ops rotate over enough copies of their inputs that the
//   working set of consecutive calls is at least 4x the L2, so each call
//   reads device memory and not the cache.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/ops.h"

using trainer::Device;
using trainer::DType;
using trainer::Tensor;

namespace {

// ---- options ----------------------------------------------------------------

struct Options {
  std::string json_path;
  int reps = 20;
  int warmup = 3;
  std::string only;
  bool quick = false;
  // Slow kernels get fewer reps so one measurement stays near this long.
  double target_ms_per_measurement = 1500.0;
};

// ---- device buffers -----------------------------------------------------------

struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { CUDA_CHECK(cudaMalloc(&p, n), std::to_string(n) + " bytes"); }
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};
using Buf = std::unique_ptr<DevBuf>;
Buf alloc(size_t bytes) { return std::make_unique<DevBuf>(bytes); }

Tensor view(const Buf& b, DType t, std::initializer_list<int64_t> dims) {
  Tensor x(b->p, t, dims, Device::CUDA);
  if (x.nbytes() > b->bytes) throw std::logic_error("bench: view larger than its buffer");
  return x;
}

// ---- random fill, poison, finiteness check --------------------------------------

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return uint32_t(x);
}

template <typename T>
__global__ void fill_uniform_kernel(T* p, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float u = float(hash32(seed * 0x9E3779B97F4A7C15ULL + uint64_t(i)) >> 8) * (1.0f / 16777216.0f);
    const float v = lo + (hi - lo) * u;
    if constexpr (std::is_same_v<T, float>)
      p[i] = v;
    else
      p[i] = __float2bfloat16(v);
  }
}

__global__ void fill_index_kernel(int32_t* p, int64_t n, uint64_t seed, int32_t bound) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = int32_t(hash32(seed * 0x9E3779B97F4A7C15ULL + uint64_t(i)) % uint32_t(bound));
}

template <typename T>
__global__ void count_nonfinite_kernel(const T* p, int64_t n, unsigned long long* count) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float v;
    if constexpr (std::is_same_v<T, float>)
      v = p[i];
    else
      v = __bfloat162float(p[i]);
    if (!isfinite(v)) ++local;
  }
  if (local) atomicAdd(count, local);
}

uint64_t g_seed = 20261129;

void fill_uniform(Tensor t, float lo, float hi) {
  const int64_t n = t.numel();
  const int blocks = 4 * trainer::cuda::sm_count(), threads = 256;
  if (t.dtype == DType::F32)
    fill_uniform_kernel<float>
        <<<blocks, threads, 0, trainer::cuda::stream()>>>(static_cast<float*>(t.data), n, ++g_seed, lo, hi);
  else if (t.dtype == DType::BF16)
    fill_uniform_kernel<__nv_bfloat16><<<blocks, threads, 0, trainer::cuda::stream()>>>(
        static_cast<__nv_bfloat16*>(t.data), n, ++g_seed, lo, hi);
  else
    throw std::logic_error("fill_uniform: F32 or BF16 only");
  KERNEL_CHECK("fill_uniform_kernel", t.shape_str());
}

void fill_index(Tensor t, int32_t bound) {
  fill_index_kernel<<<4 * trainer::cuda::sm_count(), 256, 0, trainer::cuda::stream()>>>(
      static_cast<int32_t*>(t.data), t.numel(), ++g_seed, bound);
  KERNEL_CHECK("fill_index_kernel", t.shape_str());
}

// All-ones bytes are NaN in bf16 and fp32: an element the op never writes
// fails the finiteness check.
void poison(Tensor t) {
  CUDA_CHECK(cudaMemsetAsync(t.data, 0xFF, t.nbytes(), trainer::cuda::stream()), "poison " + t.shape_str());
}

uint64_t count_nonfinite(Tensor t) {
  static unsigned long long* d_count = nullptr;
  if (!d_count) CUDA_CHECK(cudaMalloc(&d_count, sizeof(unsigned long long)), "nonfinite counter");
  cudaStream_t s = trainer::cuda::stream();
  CUDA_CHECK(cudaMemsetAsync(d_count, 0, sizeof(unsigned long long), s), "");
  const int blocks = 4 * trainer::cuda::sm_count(), threads = 256;
  if (t.dtype == DType::F32)
    count_nonfinite_kernel<float>
        <<<blocks, threads, 0, s>>>(static_cast<const float*>(t.data), t.numel(), d_count);
  else if (t.dtype == DType::BF16)
    count_nonfinite_kernel<__nv_bfloat16>
        <<<blocks, threads, 0, s>>>(static_cast<const __nv_bfloat16*>(t.data), t.numel(), d_count);
  else
    throw std::logic_error("count_nonfinite: F32 or BF16 only");
  KERNEL_CHECK("count_nonfinite_kernel", t.shape_str());
  unsigned long long h = 0;
  CUDA_CHECK(cudaMemcpyAsync(&h, d_count, sizeof(h), cudaMemcpyDeviceToHost, s), "");
  CUDA_CHECK(cudaStreamSynchronize(s), "");
  return h;
}

// Runs `op` once on poisoned outputs and returns "" or a description of the
// outputs that hold NaN/Inf.
std::string check_outputs(const std::function<void()>& op, std::vector<std::pair<std::string, Tensor>> outs) {
  for (auto& [name, t] : outs) poison(t);
  op();
  CUDA_CHECK(cudaStreamSynchronize(trainer::cuda::stream()), "first call");
  std::string bad;
  for (auto& [name, t] : outs) {
    const uint64_t n = count_nonfinite(t);
    if (n) bad += (bad.empty() ? "" : ",") + name + ":" + std::to_string(n) + "/" + std::to_string(t.numel());
  }
  return bad;
}

// ---- timing ---------------------------------------------------------------------

struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};

// op(i) runs the i-th call (i picks the input copy where inputs rotate).
Timing time_op(const Options& o, const std::function<void(int)>& op) {
  cudaStream_t s = trainer::cuda::stream();
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a), "");
  CUDA_CHECK(cudaEventCreate(&b), "");
  int call = 0;
  float first_ms = 0;
  for (int i = 0; i < std::max(1, o.warmup); ++i) {
    CUDA_CHECK(cudaEventRecord(a, s), "");
    op(call++);
    CUDA_CHECK(cudaEventRecord(b, s), "");
    CUDA_CHECK(cudaEventSynchronize(b), "warm-up");
    CUDA_CHECK(cudaEventElapsedTime(&first_ms, a, b), "");
    // A call this slow is warm after one run; more would only spend the budget.
    if (first_ms > 0.1 * o.target_ms_per_measurement) break;
  }
  const int reps = std::clamp(int(o.target_ms_per_measurement / std::max(first_ms, 1e-3f)), 3, o.reps);
  std::vector<float> t(reps);
  for (int r = 0; r < reps; ++r) {
    CUDA_CHECK(cudaEventRecord(a, s), "");
    op(call++);
    CUDA_CHECK(cudaEventRecord(b, s), "");
    CUDA_CHECK(cudaEventSynchronize(b), "timed call");
    CUDA_CHECK(cudaEventElapsedTime(&t[r], a, b), "");
  }
  CUDA_CHECK(cudaGetLastError(), "after timing");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  Timing res;
  res.reps = reps;
  res.min_ms = t.front();
  res.median_ms = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
  return res;
}

// Copies of a memory-bound op's inputs so that consecutive calls touch at
// least 4x the L2 size.
int rotation_copies(size_t bytes_per_call) {
  static size_t l2 = 0;
  if (!l2) {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev), "");
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev), "");
    l2 = size_t(v);
  }
  const size_t want = 4 * l2;
  return int(std::max<size_t>(1, (want + bytes_per_call - 1) / bytes_per_call));
}

// ---- results --------------------------------------------------------------------

struct Result {
  std::vector<std::pair<std::string, std::string>> fields;  // in print order
  void add(const std::string& k, const std::string& v) { fields.emplace_back(k, v); }
  void add(const std::string& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    fields.emplace_back(k, buf);
  }
  void add(const std::string& k, int64_t v) { fields.emplace_back(k, std::to_string(v)); }
};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (c == '\n')
      o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      o += ' ';
    else
      o += c;
  }
  return o;
}

bool is_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end && *end == '\0' && s != "nan" && s != "inf" && s != "-inf";
}

struct Report {
  std::string json_path;
  Result device;
  std::vector<Result> results;

  void emit(Result r) {
    std::string line = "RESULT impl=ours";
    for (auto& [k, v] : r.fields) {
      const bool quote = v.find(' ') != std::string::npos || v.empty();
      line += " " + k + "=" + (quote ? "\"" + v + "\"" : v);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    results.push_back(std::move(r));
    write();
  }

  static std::string object(const Result& r) {
    // Appends only: GCC 12 warns (-Wrestrict, falsely) on "x" + std::string&&.
    std::string o = "{";
    for (size_t i = 0; i < r.fields.size(); ++i) {
      const auto& [k, v] = r.fields[i];
      if (i) o += ", ";
      o += '"';
      o += json_escape(k);
      o += "\": ";
      if (is_number(v)) {
        o += v;
      } else {
        o += '"';
        o += json_escape(v);
        o += '"';
      }
    }
    o += '}';
    return o;
  }

  // Written in place, not through a temporary file: the GPU machine brings
  // back at most 8 files, and a stray temporary left by a kill would push one out.
  void write() const {
    if (json_path.empty()) return;
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "bench: cannot write %s\n", json_path.c_str());
      return;
    }
    std::fprintf(f, "{\"impl\": \"ours\", \"device\": %s, \"results\": [\n", object(device).c_str());
    for (size_t i = 0; i < results.size(); ++i)
      std::fprintf(f, "  %s%s\n", object(results[i]).c_str(), i + 1 < results.size() ? "," : "");
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
};

// A CUDA error that poisons the context (illegal address, launch failure)
// makes every later call fail too: stop after it instead of reporting noise.
bool context_is_broken() {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  return e != cudaSuccess && e != cudaErrorNotReady;
}

// ---- the benchmarks -----------------------------------------------------------------

// Runs one shape of a benchmark; an exception becomes an error result under
// `names` (with the shape's fields) so the other shapes still run, unless
// the CUDA context is broken, which ends the whole program's benchmarking.
void guarded(Report& rep, const std::vector<std::string>& names, const Result& shape,
             const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    for (const auto& n : names) {
      Result r;
      r.add("name", n);
      for (const auto& f : shape.fields) r.fields.push_back(f);
      r.add("status", "error");
      r.add("error", e.what());
      rep.emit(std::move(r));
    }
    std::fprintf(stderr, "bench_kernels: %s failed: %s\n", names.front().c_str(), e.what());
    if (context_is_broken()) throw;
  }
}

// Common tail of every memory-bound measurement.
void finish_bandwidth(Report& rep, Result r, const Timing& t, double bytes, int copies, const std::string& bad) {
  r.add("ms", t.median_ms);
  r.add("min_ms", t.min_ms);
  r.add("reps", int64_t(t.reps));
  r.add("bytes", bytes);
  r.add("gbps", bytes / (t.median_ms * 1e-3) / 1e9);
  r.add("copies", int64_t(copies));
  r.add("nonfinite", bad.empty() ? "none" : bad);
  r.add("status", bad.empty() ? "ok" : "nonfinite");
  rep.emit(std::move(r));
}

void bench_copy(const Options& o, Report& rep) {
  // 1 GiB each way: 35x the H200's L2, and long enough (~0.5 ms) to hide launch.
  const int64_t n = int64_t(1) << 29;  // bf16 elements
  Buf src = alloc(n * 2), dst = alloc(n * 2);
  Tensor s = view(src, DType::BF16, {n}), d = view(dst, DType::BF16, {n});
  fill_uniform(s, -1, 1);
  cudaStream_t st = trainer::cuda::stream();
  auto memcpy_op = [&](int) {
    CUDA_CHECK(cudaMemcpyAsync(d.data, s.data, d.nbytes(), cudaMemcpyDeviceToDevice, st), "D2D copy");
  };
  {
    const std::string bad = check_outputs([&] { memcpy_op(0); }, {{"dst", d}});
    Result r;
    r.add("name", "copy");
    r.add("what", "cudaMemcpyAsync D2D");
    r.add("numel", n);
    finish_bandwidth(rep, std::move(r), time_op(o, memcpy_op), 2.0 * double(d.nbytes()), 1, bad);
  }
  // The backend's own copy kernel, which the trainer uses for activations.
  Result shape;
  shape.add("numel", n);
  guarded(rep, {"copy_ops"}, shape, [&] {
    auto op = [&](int) { trainer::ops::copy(d, s); };
    Result r;
    r.add("name", "copy_ops");
    r.add("what", "ops::copy bf16");
    r.add("numel", n);
    const std::string bad = check_outputs([&] { op(0); }, {{"dst", d}});
    finish_bandwidth(rep, std::move(r), time_op(o, op), 2.0 * double(d.nbytes()), 1, bad);
  });
}

void bench_gemm(const Options& o, Report& rep) {
  const int64_t M = 8192, N = 8192, K = 8192;
  Buf a = alloc(M * K * 2), w = alloc(N * K * 2), c = alloc(M * N * 2);
  Tensor A = view(a, DType::BF16, {M, K}), W = view(w, DType::BF16, {N, K}), C = view(c, DType::BF16, {M, N});
  fill_uniform(A, -1, 1);
  fill_uniform(W, -1, 1);
  auto op = [&](int) { trainer::ops::linear_forward(C, A, W, Tensor()); };
  const std::string bad = check_outputs([&] { op(0); }, {{"out", C}});
  const Timing t = time_op(o, op);
  const double flops = 2.0 * double(M) * double(N) * double(K);
  Result r;
  r.add("name", "gemm");
  r.add("what", "ops::linear_forward bf16 (cuBLASLt), out = A @ W^T");
  r.add("m", M);
  r.add("n", N);
  r.add("k", K);
  r.add("ms", t.median_ms);
  r.add("min_ms", t.min_ms);
  r.add("reps", int64_t(t.reps));
  r.add("flops", flops);
  r.add("tflops", flops / (t.median_ms * 1e-3) / 1e12);
  r.add("nonfinite", bad.empty() ? "none" : bad);
  r.add("status", bad.empty() ? "ok" : "nonfinite");
  rep.emit(std::move(r));
}

void bench_rmsnorm(const Options& o, Report& rep) {
  for (int64_t C : {int64_t(768), int64_t(2048), int64_t(4096)}) {
    const int64_t N = (int64_t(256) << 20) / (C * 2);  // 256 MiB of bf16 input per call
    Result shape;
    shape.add("tokens", N);
    shape.add("c", C);
    guarded(rep, {"rmsnorm_fwd"}, shape, [&] {
      const double bytes = double(N * C * 2) * 2 + double(N * 4) + double(C * 2);
      const int copies = rotation_copies(size_t(bytes));
      std::vector<Buf> xs, outs, rstds;
      std::vector<Tensor> X, O, R;
      for (int i = 0; i < copies; ++i) {
        xs.push_back(alloc(N * C * 2));
        outs.push_back(alloc(N * C * 2));
        rstds.push_back(alloc(N * 4));
        X.push_back(view(xs.back(), DType::BF16, {N, C}));
        O.push_back(view(outs.back(), DType::BF16, {N, C}));
        R.push_back(view(rstds.back(), DType::F32, {N}));
        fill_uniform(X.back(), -2, 2);
      }
      Buf wb = alloc(C * 2);
      Tensor Wt = view(wb, DType::BF16, {C});
      fill_uniform(Wt, 0.5f, 1.5f);
      auto op = [&](int i) {
        const int j = i % copies;
        trainer::ops::rmsnorm_forward(O[j], R[j], X[j], Wt, 1e-5f);
      };
      const std::string bad = check_outputs([&] { op(0); }, {{"out", O[0]}, {"rstd", R[0]}});
      Result r;
      r.add("name", "rmsnorm_fwd");
      r.add("tokens", N);
      r.add("c", C);
      finish_bandwidth(rep, std::move(r), time_op(o, op), bytes, copies, bad);
    });
  }
}

void bench_adamw(const Options& o, Report& rep) {
  // 128M parameters: bf16 param + fp32 master, bf16 grad, fp32 m and v.
  // Bytes per parameter: read master 4 + grad 2 + m 4 + v 4, write master 4 +
  // m 4 + v 4 + param 2 = 28. (torch.optim.AdamW(fused=True) on fp32 params
  // with fp32 grads also moves 28: read p,g,m,v, write p,m,v.)
  const int64_t n = int64_t(128) << 20;
  Buf p = alloc(n * 2), master = alloc(n * 4), g = alloc(n * 2), m = alloc(n * 4), v = alloc(n * 4);
  Tensor P = view(p, DType::BF16, {n}), Ms = view(master, DType::F32, {n}), G = view(g, DType::BF16, {n}),
         Mo = view(m, DType::F32, {n}), V = view(v, DType::F32, {n});
  fill_uniform(Ms, -0.05f, 0.05f);
  fill_uniform(G, -1e-2f, 1e-2f);
  fill_uniform(Mo, -1e-3f, 1e-3f);
  fill_uniform(V, 0.0f, 1e-4f);  // second moments are non-negative
  trainer::ops::AdamWStep s{3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, 1.0f};
  // Master, m and v are updated in place; poisoning them would feed NaN into
  // the next call, so only param (written from master) is poisoned, and the
  // in-place outputs are checked after the call.
  auto op = [&](int) { trainer::ops::adamw_update_master(P, Ms, G, Mo, V, s); };
  std::string bad = check_outputs([&] { op(0); }, {{"param", P}});
  for (auto& [name, t] : std::vector<std::pair<std::string, Tensor>>{{"master", Ms}, {"m", Mo}, {"v", V}})
    if (const uint64_t k = count_nonfinite(t)) bad += (bad.empty() ? "" : ",") + name + ":" + std::to_string(k);
  Result r;
  r.add("name", "adamw");
  r.add("what", "ops::adamw_update_master bf16 param + fp32 master/m/v, bf16 grad");
  r.add("params", n);
  r.add("bytes_per_param", int64_t(28));
  finish_bandwidth(rep, std::move(r), time_op(o, op), 28.0 * double(n), 1, bad);
}

void bench_cross_entropy(const Options& o, Report& rep) {
  for (int64_t V : {int64_t(32000), int64_t(50304)}) {
    const int64_t N = 8192;
    Result shape;
    shape.add("tokens", N);
    shape.add("vocab", V);
    guarded(rep, {"cross_entropy"}, shape, [&] {
      // Useful bytes: logits read once, dlogits written once, targets, losses.
      const double bytes = double(N * V) * 2 * 2 + double(N) * 8;
      Buf lb = alloc(N * V * 2), db = alloc(N * V * 2), tb = alloc(N * 4), sb = alloc(N * 4);
      Tensor L = view(lb, DType::BF16, {N, V}), D = view(db, DType::BF16, {N, V}), T = view(tb, DType::I32, {N}),
             S = view(sb, DType::F32, {N});
      fill_uniform(L, -4, 4);
      fill_index(T, int32_t(V));
      // dlogits is a separate buffer (the trainer may alias it to logits) so
      // every call sees the same logits.
      auto op = [&](int) { trainer::ops::cross_entropy_forward_backward(S, D, L, T, 1.0f / float(N)); };
      const std::string bad = check_outputs([&] { op(0); }, {{"losses", S}, {"dlogits", D}});
      Result r;
      r.add("name", "cross_entropy");
      r.add("tokens", N);
      r.add("vocab", V);
      finish_bandwidth(rep, std::move(r), time_op(o, op), bytes, 1, bad);
    });
  }
}

void bench_attention(const Options& o, Report& rep) {
  std::vector<int64_t> seqs = {1024, 2048, 4096, 8192, 16384};
  if (o.quick) seqs = {1024, 4096, 16384};
  for (int64_t D : {int64_t(64), int64_t(128)}) {
    for (int64_t T : seqs) {
      // FlashAttention's benchmark shapes: 16k tokens per batch, model width
      // 2048 (so H*D = 2048): B*H*T/128 >= 2048 query tiles at every length,
      // enough to fill 132 SMs many times over.
      const int64_t B = std::max<int64_t>(1, 16384 / T), H = 2048 / D;
      Result shape;
      shape.add("seq", T);
      shape.add("d", D);
      shape.add("batch", B);
      shape.add("heads", H);
      shape.add("causal", int64_t(1));
      // Names still to be reported: an error after the forward's result
      // is reported against the backward only.
      std::vector<std::string> pending = {"attn_fwd", "attn_bwd"};
      guarded(rep, pending, shape, [&] {
        const int64_t elems = B * T * H * D;
        Buf qb = alloc(elems * 2), kb = alloc(elems * 2), vb = alloc(elems * 2), ob = alloc(elems * 2),
            lb = alloc(B * H * T * 4), dob = alloc(elems * 2), dqb = alloc(elems * 2), dkb = alloc(elems * 2),
            dvb = alloc(elems * 2);
        Tensor Q = view(qb, DType::BF16, {B, T, H, D}), K = view(kb, DType::BF16, {B, T, H, D}),
               Vt = view(vb, DType::BF16, {B, T, H, D}), O = view(ob, DType::BF16, {B, T, H, D}),
               L = view(lb, DType::F32, {B, H, T}), dO = view(dob, DType::BF16, {B, T, H, D}),
               dQ = view(dqb, DType::BF16, {B, T, H, D}), dK = view(dkb, DType::BF16, {B, T, H, D}),
               dV = view(dvb, DType::BF16, {B, T, H, D});
        for (Tensor t : {Q, K, Vt, dO}) fill_uniform(t, -1, 1);
        // Causal: half the score matrix. Forward = 2 matmuls of 2*T*T*D each;
        // backward = 5 such matmuls (2.5x), FlashAttention's accounting.
        const double fwd_flops = 4.0 * double(B * H) * double(T) * double(T) * double(D) / 2.0;
        const double bwd_flops = 2.5 * fwd_flops;
        auto base = [&](const char* name) {
          Result r;
          r.add("name", name);
          r.add("seq", T);
          r.add("d", D);
          r.add("batch", B);
          r.add("heads", H);
          r.add("causal", int64_t(1));
          return r;
        };
        auto emit = [&](Result r, const Timing& t, double flops, const std::string& bad) {
          r.add("ms", t.median_ms);
          r.add("min_ms", t.min_ms);
          r.add("reps", int64_t(t.reps));
          r.add("flops", flops);
          r.add("tflops", flops / (t.median_ms * 1e-3) / 1e12);
          r.add("nonfinite", bad.empty() ? "none" : bad);
          r.add("status", bad.empty() ? "ok" : "nonfinite");
          rep.emit(std::move(r));
        };
        auto fwd = [&](int) { trainer::ops::attention_forward(O, L, Q, K, Vt, true, 0, {}); };
        std::string bad = check_outputs([&] { fwd(0); }, {{"out", O}, {"lse", L}});
        const Timing tf = time_op(o, fwd);
        emit(base("attn_fwd"), tf, fwd_flops, bad);
        pending = {"attn_bwd"};
        // Backward needs the forward's out and lse: the last timed forward left them.
        auto bwd = [&](int) { trainer::ops::attention_backward(dQ, dK, dV, dO, Q, K, Vt, O, L, true, 0, {}); };
        bad = check_outputs([&] { bwd(0); }, {{"dq", dQ}, {"dk", dK}, {"dv", dV}});
        const Timing tb = time_op(o, bwd);
        emit(base("attn_bwd"), tb, bwd_flops, bad);
        Timing sum;
        sum.median_ms = tf.median_ms + tb.median_ms;
        sum.min_ms = tf.min_ms + tb.min_ms;
        sum.reps = std::min(tf.reps, tb.reps);
        emit(base("attn_fwdbwd"), sum, fwd_flops + bwd_flops, "");
      });
    }
  }
}

bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--json")
      o.json_path = next();
    else if (a == "--reps")
      o.reps = std::max(3, std::stoi(next()));
    else if (a == "--warmup")
      o.warmup = std::max(1, std::stoi(next()));
    else if (a == "--only")
      o.only = next();
    else if (a == "--quick")
      o.quick = true;
    else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: bench_kernels [--json FILE] [--reps N] [--warmup N] [--only SUBSTRING] [--quick]\n"
          "benchmarks: copy gemm rmsnorm adamw cross_entropy attention\n");
      return false;
    } else {
      throw std::invalid_argument("unknown argument '" + a + "' (see --help)");
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    if (!parse(argc, argv, o)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 2;
  }
  Report rep;
  rep.json_path = o.json_path;
  try {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev), "");
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev), "");
    int rt = 0, drv = 0;
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    rep.device.add("name", p.name);
    rep.device.add("sm", std::to_string(p.major) + "." + std::to_string(p.minor));
    rep.device.add("sms", int64_t(p.multiProcessorCount));
    rep.device.add("l2_bytes", int64_t(p.l2CacheSize));
    rep.device.add("memory_bytes", int64_t(p.totalGlobalMem));
    rep.device.add("cuda_runtime", int64_t(rt));
    rep.device.add("cuda_driver", int64_t(drv));
    std::printf("device: %s, sm_%d%d, %d SMs, L2 %d MiB, %.1f GiB, runtime %d, driver %d\n", p.name, p.major,
                p.minor, p.multiProcessorCount, p.l2CacheSize >> 20, double(p.totalGlobalMem) / (1 << 30), rt,
                drv);
    (void)trainer::cuda::stream();  // creates the backend's context before any timing
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: no usable CUDA device: %s\n", e.what());
    return 1;
  }

  const std::vector<std::pair<std::string, std::function<void(const Options&, Report&)>>> benches = {
      {"copy", bench_copy},
      {"gemm", bench_gemm},
      {"rmsnorm", bench_rmsnorm},
      {"adamw", bench_adamw},
      {"cross_entropy", bench_cross_entropy},
      {"attention", bench_attention},
  };
  int failures = 0;
  for (const auto& [name, fn] : benches) {
    if (!o.only.empty() && name.find(o.only) == std::string::npos) continue;
    try {
      fn(o, rep);
    } catch (const std::exception& e) {
      ++failures;
      std::fprintf(stderr, "bench_kernels: %s failed: %s\n", name.c_str(), e.what());
      Result r;
      r.add("name", name);
      r.add("status", "error");
      r.add("error", e.what());
      rep.emit(std::move(r));
      if (context_is_broken()) {
        std::fprintf(stderr, "bench_kernels: the CUDA context is broken; skipping the remaining benchmarks\n");
        break;
      }
    }
  }
  int nonfinite = 0;
  for (const auto& r : rep.results)
    for (const auto& [k, v] : r.fields)
      if (k == "status" && v == "nonfinite") ++nonfinite;
  std::printf("bench_kernels: %zu results, %d benchmark(s) failed, %d with non-finite outputs\n",
              rep.results.size(), failures, nonfinite);
  return failures || nonfinite ? 1 : 0;
}
