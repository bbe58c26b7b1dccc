// Linear layer of the CUDA backend (semantics: ops::linear_forward/backward in
// kernels/op_list.h) through cuBLASLt, plus two small kernels.
//
// Mapping: tensors are row-major, cuBLASLt is column-major, and a row-major
// [R, C] matrix is the column-major [C, R] one. So every product is written
// transposed:
//   forward   out^T [OC,N]  = W^T-view (op T on the stored [IC,OC]) * inp^T [IC,N]   (m=OC, n=N,  k=IC)
//   dinp      dinp^T [IC,N] = W [IC,OC] * dout^T [OC,N]                           (m=IC, n=N,  k=OC)
//   dweight   dW^T [IC,OC] += inp^T [IC,N] * (dout^T [OC,N])^T                     (m=IC, n=OC, k=N)
// Compute type CUBLAS_COMPUTE_32F with float scales: exact fp32 arithmetic
// for F32 tensors (no TF32), fp32 accumulation for BF16/F16. A and B share one
// storage type; C/D is that type or F32 (the combinations cuBLASLt supports
// for COMPUTE_32F).
//
// Bias: the CUBLASLT_EPILOGUE_BIAS epilogue (bias vector of length m = OC,
// bias dtype == out dtype). When cuBLASLt has no algorithm for that (another
// bias dtype, odd alignment), out is seeded with the broadcast bias and the
// GEMM runs with beta = 1: one rounding of (acc + bias) either way.
// dbias += column sums of dout: a deterministic two-pass kernel (fixed
// summation order; no float atomics), not BGRADB, which overwrites the vector
// instead of accumulating into it across micro-batches.
//
// Plans (matmul descriptor, layouts, chosen algorithm) are cached per shape,
// dtypes, epilogue and pointer alignment, so a repeated call costs one map
// look-up. The algorithm comes from cublasLtMatmulAlgoGetHeuristic with the
// real pointer alignments (a row slice of a grouped GEMM is often not
// 256-byte aligned, which the default preference assumes). cuBLASLt results
// are bitwise reproducible for a given algorithm and GPU; every split-K
// reduction scheme it offers is sequential, so the GEMMs are deterministic.
//
// Cost: each GEMM 2*m*n*k flops, reads (m*k + k*n) elements and writes m*n
// (reads them too when beta = 1). dbias: N*OC reads of dout (plus a small
// chunks*OC fp32 scratch), OC writes.
#include <array>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/shared_memory.cuh"

namespace trainer::cuda {
namespace {

// ---- argument checks ----------------------------------------------------------

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// Shapes arrive checked by the router (kernels/checks/linear.cpp); what is
// cuBLASLt's: which storage types combine in one GEMM.

void same_dtype(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  if (a.dtype != b.dtype)
    fail(op, std::string(an) + " " + a.shape_str() + " is " + dtype_name(a.dtype) + " but " + bn + " " +
                 b.shape_str() + " is " + dtype_name(b.dtype) + "; they must share one storage type");
}

// An output of a GEMM whose inputs are `in`: the same type, or F32.
void output_dtype(const char* op, const char* name, const Tensor& t, DType in) {
  if (t.dtype != in && t.dtype != DType::F32)
    fail(op, std::string(name) + " " + t.shape_str() + " is " + dtype_name(t.dtype) + "; with " +
                 dtype_name(in) + " inputs it must be " + dtype_name(in) + " or F32");
}

struct Dims {
  int64_t N, IC, OC;
};

// inp [..., IC] over N rows, weight [OC, IC]. Rows come from inp, so
// IC == 0 means no rows.
Dims dims_of(const Tensor& inp, const Tensor& weight) {
  const int64_t OC = weight.dim(0), IC = weight.dim(1);
  return {IC > 0 ? inp.numel() / IC : 0, IC, OC};
}

std::string mat(const char* name, const Tensor& t) { return std::string(name) + " " + t.shape_str() + " " + dtype_name(t.dtype); }

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: throw std::logic_error(std::string("gemm: no cuBLASLt type for ") + dtype_name(t));
  }
}

uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  uint32_t al = 1;
  while (al < 256 && (a % (al * 2)) == 0) al *= 2;
  return al;
}

unsigned grid_for(int64_t work, int threads) {
  const int64_t blocks = (work + threads - 1) / threads;
  const int64_t cap = int64_t(sm_count()) * 32;
  return unsigned(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// ---- cuBLASLt plans -------------------------------------------------------------

// D = alpha * op(A) op(B) + beta * C with C == D (column-major, m x n).
struct Matmul {
  cublasOperation_t ta, tb;
  uint64_t m, n, k;
  int64_t lda, ldb, ldc;
  cudaDataType_t ab_type, c_type;
  const void* A;
  const void* B;
  void* C;
  float alpha, beta;
  const void* bias = nullptr;  // non-null: EPILOGUE_BIAS (length m)
  cudaDataType_t bias_type = CUDA_R_32F;
};

// Everything the heuristic's choice depends on, as plain integers (no padding
// bytes to compare): ops, m, n, k, leading dims, types (-1: no bias
// epilogue) and the alignment of each pointer.
using PlanKey = std::array<int64_t, 15>;

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the values
    for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
    return size_t(h);
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;  // false: no algorithm for this epilogue (the caller falls back)
};

void destroy(Plan& p) {
  // Descriptors are host objects read when a matmul is enqueued, so they may
  // go while that matmul still runs.
  if (p.desc) cublasLtMatmulDescDestroy(p.desc);
  if (p.a) cublasLtMatrixLayoutDestroy(p.a);
  if (p.b) cublasLtMatrixLayoutDestroy(p.b);
  if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  p = Plan{};
}

// Grouped GEMMs see a new row count per expert and step, so the map is bounded:
// past the limit it starts over (a heuristic query costs microseconds).
constexpr size_t kMaxPlans = 4096;

std::mutex g_plan_mutex;
std::unordered_map<PlanKey, Plan, PlanKeyHash>& plans() {
  static auto* m = new std::unordered_map<PlanKey, Plan, PlanKeyHash>();  // never destroyed: outlives exit
  return *m;
}

std::string describe(const Matmul& s) {
  auto op = [](cublasOperation_t t) { return t == CUBLAS_OP_N ? "N" : "T"; };
  return "m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) + " op(A)=" +
         op(s.ta) + " op(B)=" + op(s.tb) + " lda=" + std::to_string(s.lda) + " ldb=" + std::to_string(s.ldb) +
         " ldc=" + std::to_string(s.ldc) + " ab_type=" + std::to_string(int(s.ab_type)) +
         " c_type=" + std::to_string(int(s.c_type)) + (s.bias ? " epilogue=BIAS" : "");
}

Plan make_plan(const Matmul& s, const std::string& ctx) {
  Plan p;
  try {
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), ctx);
    const int32_t ta = s.ta, tb = s.tb;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), ctx);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), ctx);
    if (s.bias) {
      const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
      const int32_t bt = s.bias_type;
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), ctx);
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)),
                   ctx);
      CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &s.bias, sizeof(s.bias)), ctx);
    }
    // Layouts describe the stored matrices, before op().
    const bool an = s.ta == CUBLAS_OP_N, bn = s.tb == CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, s.ab_type, an ? s.m : s.k, an ? s.k : s.m, s.lda), ctx);
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, s.ab_type, bn ? s.k : s.n, bn ? s.n : s.k, s.ldb), ctx);
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, s.c_type, s.m, s.n, s.ldc), ctx);

    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref), ctx);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    {
      const uint64_t ws = cublaslt_workspace_bytes();
      const uint32_t al[4] = {alignment(s.A), alignment(s.B), alignment(s.C), alignment(s.C)};
      const cublasLtMatmulPreferenceAttributes_t which[4] = {
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
      st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
      for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i)
        st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof(al[i]));
      if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(cublaslt(), p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &returned);
      cublasLtMatmulPreferenceDestroy(pref);
    }
    p.ok = st == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p.ok) {
      p.algo = result.algo;
    } else if (!s.bias) {
      // Without an epilogue there is no fallback: these types and shapes are
      // ones cuBLASLt documents, so this is an environment problem.
      if (st != CUBLAS_STATUS_SUCCESS) cublas_fail("cublasLtMatmulAlgoGetHeuristic", ctx + "; " + describe(s), st);
      throw std::runtime_error("cuBLASLt has no algorithm for " + describe(s) + " (" + ctx + ")");
    }
  } catch (...) {
    destroy(p);
    throw;
  }
  return p;
}

// Runs the matmul on the compute stream. Returns false (and does nothing)
// only when a bias epilogue was asked for and cuBLASLt has no algorithm for
// it; every other failure throws.
template <typename Ctx>
bool matmul(const Matmul& s, const Ctx& ctx) {
  const PlanKey key = {int64_t(s.ta), int64_t(s.tb), int64_t(s.m), int64_t(s.n), int64_t(s.k), s.lda, s.ldb, s.ldc,
                       int64_t(s.ab_type), int64_t(s.c_type), s.bias ? int64_t(s.bias_type) : -1,
                       int64_t(alignment(s.A)), int64_t(alignment(s.B)), int64_t(alignment(s.C)),
                       s.bias ? int64_t(alignment(s.bias)) : 0};

  std::lock_guard<std::mutex> lock(g_plan_mutex);
  auto& cache = plans();
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxPlans) {
      for (auto& kv : cache) destroy(kv.second);
      cache.clear();
    }
    it = cache.emplace(key, make_plan(s, ctx())).first;
  }
  Plan& p = it->second;
  if (!p.ok) return false;
  if (s.bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &s.bias, sizeof(s.bias)),
                 ctx());
  CUBLAS_CHECK(cublasLtMatmul(cublaslt(), p.desc, &s.alpha, s.A, p.a, s.B, p.b, &s.beta, s.C, p.c, s.C, p.c, &p.algo,
                              cublaslt_workspace(), cublaslt_workspace_bytes(), stream()),
               ctx() + "; " + describe(s));
  return true;
}

// ---- kernels -------------------------------------------------------------------

// out[n, c] = bias[c] (converted), the seed of a beta = 1 GEMM.
template <typename TO, typename TB>
__global__ void broadcast_bias_kernel(TO* out, const TB* bias, int64_t N, int64_t OC) {
  const int64_t total = N * OC;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_float<TO>(to_float(bias[i % OC]));
}

constexpr int kColTile = 32;  // columns per block: one warp reads 32 adjacent elements of a row
constexpr int kRowLanes = 8;  // rows read in parallel per block

// Column sums of g [N, OC] over the rows of chunk blockIdx.y. Thread (x, y)
// adds rows y, y+8, ... of its column in order; the 8 partials are then added
// in y order: the result depends only on N, OC and the chunking.
// direct: dbias[c] += sum (one chunk); else partial[chunk, c] = sum.
template <typename TG, typename TB>
__global__ void colsum_kernel(const TG* g, int64_t N, int64_t OC, int64_t rows_per_chunk, float* partial,
                              TB* dbias, bool direct) {
  TRAINER_SHARED(float, s, [kRowLanes][kColTile + 1]);
  const int64_t c = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc = 0.f;
  if (c < OC)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) acc += to_float(g[r * OC + c]);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < OC) {
    float sum = 0.f;
#pragma unroll
    for (int y = 0; y < kRowLanes; ++y) sum += s[y][threadIdx.x];
    if (direct)
      dbias[c] = from_float<TB>(to_float(dbias[c]) + sum);
    else
      partial[int64_t(blockIdx.y) * OC + c] = sum;
  }
}

// dbias[c] += sum over chunks (in chunk order) of partial[chunk, c].
template <typename TB>
__global__ void colsum_finish_kernel(const float* partial, int64_t chunks, int64_t OC, TB* dbias) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < OC; c += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * OC + c];
    dbias[c] = from_float<TB>(to_float(dbias[c]) + sum);
  }
}

// Grow-only fp32 scratch for the dbias partials. Growth is stream-ordered
// (cudaFreeAsync / cudaMallocAsync on the compute stream), so kernels still
// reading the old buffer finish first. Callers hold g_scratch_mutex while they
// enqueue work on the returned pointer.
std::mutex g_scratch_mutex;
float* dbias_scratch(size_t bytes) {
  static void* buf = nullptr;
  static size_t cap = 0;
  if (bytes > cap) {
    if (buf) CUDA_CHECK(cudaFreeAsync(buf, stream()), "linear_backward dbias scratch");
    buf = nullptr;
    cap = 0;
    CUDA_CHECK(cudaMallocAsync(&buf, bytes, stream()), "linear_backward dbias scratch " + std::to_string(bytes) + " bytes");
    cap = bytes;
  }
  return static_cast<float*>(buf);
}

void add_column_sums(Tensor dbias, Tensor dout, int64_t N, int64_t OC) {
  const int64_t col_blocks = (OC + kColTile - 1) / kColTile;
  // Enough blocks to fill the GPU a few times over, each chunk >= 64 rows,
  // and the fp32 partials within 64 MiB.
  const int64_t target = 4 * int64_t(sm_count());
  int64_t chunks = (target + col_blocks - 1) / col_blocks;
  const int64_t max_by_rows = (N + 63) / 64;
  if (chunks > max_by_rows) chunks = max_by_rows;
  const int64_t max_by_bytes = (int64_t(64) << 20) / (OC * int64_t(sizeof(float)));
  if (chunks > max_by_bytes) chunks = max_by_bytes;
  if (chunks > 65535) chunks = 65535;
  if (chunks < 1) chunks = 1;
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  const bool direct = chunks == 1;

  const std::string ctx_shapes = "dout [" + std::to_string(N) + ", " + std::to_string(OC) + "] -> dbias " +
                                 dbias.shape_str() + ", " + std::to_string(chunks) + " chunks";
  std::lock_guard<std::mutex> lock(g_scratch_mutex);
  float* partial = direct ? nullptr : dbias_scratch(size_t(chunks * OC) * sizeof(float));
  const dim3 block{unsigned(kColTile), unsigned(kRowLanes)};
  const dim3 grid{unsigned(col_blocks), unsigned(chunks)};
  DISPATCH_FLOAT(dout.dtype, TG, "linear_backward", DISPATCH_FLOAT(dbias.dtype, TB, "linear_backward", {
    launch(colsum_kernel<TG, TB>, grid, block, 0, stream(), static_cast<const TG*>(dout.data), N, OC, rows_per_chunk,
           partial, static_cast<TB*>(dbias.data), direct);
    KERNEL_CHECK("colsum_kernel", ctx_shapes);
    if (!direct) {
      launch(colsum_finish_kernel<TB>, grid_for(OC, 256), 256, 0, stream(), partial, chunks, OC,
             static_cast<TB*>(dbias.data));
      KERNEL_CHECK("colsum_finish_kernel", ctx_shapes);
    }
  }));
}

}  // namespace

// ---- ops ---------------------------------------------------------------------------

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const char* op = "linear_forward";
  same_dtype(op, "inp", inp, "weight", weight);
  output_dtype(op, "out", out, inp.dtype);
  const auto [N, IC, OC] = dims_of(inp, weight);
  if (N == 0 || OC == 0) return;  // N > 0 implies IC > 0
  auto ctx = [&] { return std::string(op) + ": " + mat("out", out) + " = " + mat("inp", inp) + " @ " +
                          mat("weight", weight) + "^T" + (bias.empty() ? "" : " + " + mat("bias", bias)); };

  auto seed_with_bias = [&] {
    DISPATCH_FLOAT(out.dtype, TO, op, DISPATCH_FLOAT(bias.dtype, TB, op, {
      launch(broadcast_bias_kernel<TO, TB>, grid_for(N * OC, 256), 256, 0, stream(), static_cast<TO*>(out.data),
             static_cast<const TB*>(bias.data), N, OC);
      KERNEL_CHECK("broadcast_bias_kernel", ctx());
    }));
  };

  Matmul s{};
  s.ta = CUBLAS_OP_T;
  s.tb = CUBLAS_OP_N;
  s.m = uint64_t(OC);
  s.n = uint64_t(N);
  s.k = uint64_t(IC);
  s.lda = IC;
  s.ldb = IC;
  s.ldc = OC;
  s.ab_type = cuda_type(inp.dtype);
  s.c_type = cuda_type(out.dtype);
  s.A = weight.data;
  s.B = inp.data;
  s.C = out.data;
  s.alpha = 1.f;
  s.beta = 0.f;
  if (!bias.empty() && bias.dtype == out.dtype) {
    s.bias = bias.data;
    s.bias_type = cuda_type(bias.dtype);
    if (matmul(s, ctx)) return;
    s.bias = nullptr;
  }
  if (!bias.empty()) {
    seed_with_bias();
    s.beta = 1.f;
  }
  matmul(s, ctx);
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                     bool accumulate_dinp) {
  const char* op = "linear_backward";
  same_dtype(op, "dout", dout, "weight", weight);
  same_dtype(op, "dout", dout, "inp", inp);
  const auto [N, IC, OC] = dims_of(inp, weight);
  if (!dweight.empty()) output_dtype(op, "dweight", dweight, dout.dtype);
  if (!dinp.empty()) output_dtype(op, "dinp", dinp, dout.dtype);
  if (N == 0) return;
  auto ctx = [&](const char* what) {
    return std::string(op) + " (" + what + "): " + mat("dout", dout) + ", " + mat("inp", inp) + ", " +
           mat("weight", weight) + (dinp.empty() ? "" : ", " + mat("dinp", dinp)) +
           (dweight.empty() ? "" : ", " + mat("dweight", dweight));
  };

  if (!dinp.empty() && IC > 0) {
    if (OC == 0) {  // an empty sum
      if (!accumulate_dinp)
        CUDA_CHECK(cudaMemsetAsync(dinp.data, 0, size_t(N * IC) * dtype_size(dinp.dtype), stream()), ctx("dinp"));
    } else {
      Matmul s{};
      s.ta = CUBLAS_OP_N;
      s.tb = CUBLAS_OP_N;
      s.m = uint64_t(IC);
      s.n = uint64_t(N);
      s.k = uint64_t(OC);
      s.lda = IC;
      s.ldb = OC;
      s.ldc = IC;
      s.ab_type = cuda_type(dout.dtype);
      s.c_type = cuda_type(dinp.dtype);
      s.A = weight.data;
      s.B = dout.data;
      s.C = dinp.data;
      s.alpha = 1.f;
      s.beta = accumulate_dinp ? 1.f : 0.f;
      matmul(s, [&] { return ctx("dinp = dout @ weight"); });
    }
  }
  if (!dweight.empty() && OC > 0 && IC > 0) {
    Matmul s{};
    s.ta = CUBLAS_OP_N;
    s.tb = CUBLAS_OP_T;
    s.m = uint64_t(IC);
    s.n = uint64_t(OC);
    s.k = uint64_t(N);
    s.lda = IC;
    s.ldb = OC;
    s.ldc = IC;
    s.ab_type = cuda_type(dout.dtype);
    s.c_type = cuda_type(dweight.dtype);
    s.A = inp.data;
    s.B = dout.data;
    s.C = dweight.data;
    s.alpha = 1.f;
    s.beta = 1.f;  // weight gradients accumulate across micro-batches
    matmul(s, [&] { return ctx("dweight += dout^T @ inp"); });
  }
  if (!dbias.empty() && OC > 0) add_column_sums(dbias, dout, N, OC);
}

}  // namespace trainer::cuda
