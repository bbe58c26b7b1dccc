// cublasLtMatmul of the emulated cuBLASLt: D = alpha op(A) op(B) + beta C
// (+ bias[row] with EPILOGUE_BIAS), column-major as cuBLAS defines it: X's
// element (r, c) is at X + r + c * ld, and the layouts describe the stored
// matrices, before op().
//
// Arithmetic: the elements are read as fp32 (16-bit ones converted exactly),
// each dot product is summed in double in k order (every fp32 product is
// exact in double), alpha, beta, C and the bias are applied in double, and
// the result is rounded once to fp32, then to a 16-bit D type by
// round-to-nearest-even, as a GPU rounds its fp32 accumulator. So a result
// is at least as accurate as a GPU's fp32 accumulation, and the same on every
// machine and thread count.
//
// beta == 0 does not read C (cuBLAS's rule: C may hold anything, NaN
// included); D may be C itself (same pointer, same layout).
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "emu/bf16_bits.h"
#include "emu/cublaslt_state.h"

namespace trainer::emu::cublaslt {
namespace {

const char* kCall = "cublasLtMatmul";

float load(int32_t type, const void* base, uint64_t index) {
  switch (type) {
    case CUDA_R_32F: return static_cast<const float*>(base)[index];
    case CUDA_R_16BF: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
    default: return f16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
}

void store(int32_t type, void* base, uint64_t index, float v) {
  switch (type) {
    case CUDA_R_32F: static_cast<float*>(base)[index] = v; break;
    case CUDA_R_16BF: static_cast<uint16_t*>(base)[index] = float_to_bf16_rn(v); break;
    default: static_cast<uint16_t*>(base)[index] = float_to_f16_rn(v); break;
  }
}

// op(X) as `outer` rows of `inner` contiguous fp32 values: row o holds
// op(X)[o, 0..inner) when by_rows, else op(X)[0..inner, o] (a column of op(X)).
// One conversion per element instead of one per multiply-add.
std::vector<float> pack(const void* x, const cublasLtMatrixLayoutOpaque_t& l, bool transposed, uint64_t outer,
                        uint64_t inner, bool by_rows) {
  std::vector<float> out(size_t(outer * inner));
  for (uint64_t o = 0; o < outer; ++o)
    for (uint64_t i = 0; i < inner; ++i) {
      // Element (r, c) of op(X); op(X)[r, c] is X[c, r] when transposed.
      const uint64_t r = by_rows ? o : i, c = by_rows ? i : o;
      const uint64_t index = transposed ? c + r * uint64_t(l.ld) : r + c * uint64_t(l.ld);
      out[size_t(o * inner + i)] = load(l.type, x, index);
    }
  return out;
}

struct Job {
  const Problem* p;
  const float* a;  // op(A) by rows: [m][k]
  const float* b;  // op(B) by columns: [n][k]
  double alpha, beta;
  const void* C;
  const cublasLtMatrixLayoutOpaque_t* c;
  const void* bias;
  void* D;
  const cublasLtMatrixLayoutOpaque_t* d;
};

// The dot products of rows [i, i + R) of op(A) with one column of op(B),
// each summed in k order: R independent sums run side by side (the adds'
// latency, not their count, bounds one sum), every one the same sequence of
// additions as alone.
template <int R>
void dots(const float* a, const float* b, uint64_t k, double* acc) {
  for (int r = 0; r < R; ++r) acc[r] = 0;
  for (uint64_t l = 0; l < k; ++l)
    for (int r = 0; r < R; ++r) acc[r] += double(a[uint64_t(r) * k + l]) * double(b[l]);
}

void finish(const Job& job, uint64_t i, uint64_t j, double acc) {
  double v = job.alpha * acc;
  if (job.beta != 0) v += job.beta * double(load(job.c->type, job.C, i + j * uint64_t(job.c->ld)));
  if (job.p->bias) v += double(load(job.d->type, job.bias, i));
  store(job.d->type, job.D, i + j * uint64_t(job.d->ld), float(v));
}

// Columns [j0, j1) of D; each element is read (C) and written (D) by this
// column's owner alone, so D may be C.
void run_columns(const Job& job, uint64_t j0, uint64_t j1) {
  constexpr int R = 4;
  const Problem& p = *job.p;
  double acc[R];
  for (uint64_t j = j0; j < j1; ++j) {
    const float* bc = job.b + j * p.k;
    uint64_t i = 0;
    for (; i + R <= p.m; i += R) {
      dots<R>(job.a + i * p.k, bc, p.k, acc);
      for (int r = 0; r < R; ++r) finish(job, i + uint64_t(r), j, acc[r]);
    }
    for (; i < p.m; ++i) {
      dots<1>(job.a + i * p.k, bc, p.k, acc);
      finish(job, i, j, acc[0]);
    }
  }
}

// Large products split their columns over host threads: the results do not
// depend on the split (each element is computed whole by one thread).
void run_parallel(const Job& job) {
  const uint64_t work = job.p->m * job.p->n * std::max<uint64_t>(job.p->k, 1);
  const uint64_t hw = std::max(1u, std::thread::hardware_concurrency());
  const uint64_t threads = std::min({hw, uint64_t(16), job.p->n, std::max<uint64_t>(work >> 22, 1)});
  if (threads <= 1) return run_columns(job, 0, job.p->n);
  std::vector<std::thread> pool;
  const uint64_t per = (job.p->n + threads - 1) / threads;
  for (uint64_t t = 0; t < threads; ++t) {
    const uint64_t j0 = t * per, j1 = std::min(job.p->n, j0 + per);
    if (j0 < j1) pool.emplace_back([&job, j0, j1] { run_columns(job, j0, j1); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

void run_matmul(const Problem& p, const cublasLtMatmulDescOpaque_t& desc, float alpha, float beta, const void* A,
                const cublasLtMatrixLayoutOpaque_t& a, const void* B, const cublasLtMatrixLayoutOpaque_t& b,
                const void* C, const cublasLtMatrixLayoutOpaque_t& c, void* D, const cublasLtMatrixLayoutOpaque_t& d) {
  if (p.m == 0 || p.n == 0) return;
  // alpha == 0 reads neither A nor B (the BLAS rule), like an empty sum.
  const bool product = alpha != 0 && p.k > 0;
  const std::vector<float> ap = product ? pack(A, a, p.a_transposed, p.m, p.k, true) : std::vector<float>();
  const std::vector<float> bp = product ? pack(B, b, p.b_transposed, p.n, p.k, false) : std::vector<float>();
  Problem q = p;
  if (!product) q.k = 0;
  const Job job{&q, ap.data(), bp.data(), alpha, beta, C, &c, desc.bias, D, &d};
  run_parallel(job);
}

namespace {

// The bytes a column-major layout spans from its first element.
uint64_t span_bytes(const cublasLtMatrixLayoutOpaque_t& l) {
  if (l.rows == 0 || l.cols == 0) return 0;
  return ((l.cols - 1) * uint64_t(l.ld) + l.rows) * element_bytes(l.type);
}

bool overlap(const void* x, uint64_t xn, const void* y, uint64_t yn) {
  const auto xb = reinterpret_cast<uintptr_t>(x), yb = reinterpret_cast<uintptr_t>(y);
  return xn > 0 && yn > 0 && xb < yb + yn && yb < xb + xn;
}

uint64_t alignment_of(const void* ptr) {
  const auto a = reinterpret_cast<uintptr_t>(ptr);
  return a == 0 ? 256 : (a & (~a + 1));
}

// A pointer the chosen algorithm cannot read: null where data is needed, or
// less aligned than the elements or than the heuristic was promised.
cublasStatus_t check_pointer(const char* name, const void* ptr, bool needed, size_t elem, uint64_t promised) {
  if (!needed) return CUBLAS_STATUS_SUCCESS;
  if (!ptr) return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, std::string(name) + " is null");
  // Alignment beyond 256 bytes buys nothing (cuBLASLt's default promise).
  const uint64_t have = std::min<uint64_t>(alignment_of(ptr), 256);
  if (have < elem || have < std::min<uint64_t>(promised, 256))
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE,
                  std::string(name) + " is aligned to " + std::to_string(have) + " bytes but " +
                      (have < elem ? "its elements take " + std::to_string(elem)
                                   : "the algorithm was chosen for " + std::to_string(promised) +
                                         " (the preference's MIN_ALIGNMENT)"));
  return CUBLAS_STATUS_SUCCESS;
}

struct Operands {
  const void* A;
  const void* B;
  const void* C;
  void* D;
  const void* bias;
  float alpha, beta;
};

cublasStatus_t check_pointers(const Problem& p, const Operands& o, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo) {
  const bool out = p.m > 0 && p.n > 0, product = out && p.k > 0 && o.alpha != 0;
  const uint64_t promised[4] = {algo ? algo->data[1] : 0, algo ? algo->data[2] : 0, algo ? algo->data[3] : 0,
                                algo ? algo->data[4] : 0};
  cublasStatus_t s = check_pointer("A", o.A, product, element_bytes(a->type), promised[0]);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_pointer("B", o.B, product, element_bytes(b->type), promised[1]);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_pointer("C", o.C, out && o.beta != 0, element_bytes(c->type), promised[2]);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_pointer("D", o.D, out, element_bytes(d->type), promised[3]);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = check_pointer("the BIAS_POINTER of EPILOGUE_BIAS", o.bias, out && p.bias, element_bytes(d->type), 0);
  return s;
}

// cuBLASLt computes in place only when C and D are one matrix; D must not
// overlap the inputs at all (the kernels read A and B while D is written).
cublasStatus_t check_aliasing(const Operands& o, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d) {
  const uint64_t dn = span_bytes(*d);
  if (o.C == o.D && o.beta != 0 && c->ld != d->ld)
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE,
                  "C and D are the same memory but Cdesc's leading dimension " + std::to_string(c->ld) +
                      " differs from Ddesc's " + std::to_string(d->ld));
  if (o.C != o.D && o.beta != 0 && overlap(o.C, span_bytes(*c), o.D, dn))
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, "C and D overlap without being the same matrix");
  if (overlap(o.A, span_bytes(*a), o.D, dn) || overlap(o.B, span_bytes(*b), o.D, dn))
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, "D overlaps A or B; cuBLASLt computes in place only into C");
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace trainer::emu::cublaslt

using namespace trainer::emu::cublaslt;

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                         const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                                         const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                         cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                                         const cublasLtMatmulAlgo_t* algo, void* /*workspace*/,
                                         size_t /*workspaceSizeInBytes*/, cudaStream_t /*stream*/) {
  Problem p;
  cublasStatus_t s = check_problem(kCall, lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (!alpha || !beta)
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, std::string(alpha ? "beta" : "alpha") + " is null");
  if (algo && algo->data[0] != kAlgoMagic)
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, "algo is not one cublasLtMatmulAlgoGetHeuristic returned");
  Operands o{A, B, C, D, computeDesc->bias, 0, 0};
  std::memcpy(&o.alpha, alpha, sizeof(float));  // SCALE_TYPE CUDA_R_32F, host pointer mode
  std::memcpy(&o.beta, beta, sizeof(float));
  s = check_pointers(p, o, Adesc, Bdesc, Cdesc, Ddesc, algo);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_aliasing(o, Adesc, Bdesc, Cdesc, Ddesc);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  run_matmul(p, *computeDesc, o.alpha, o.beta, A, *Adesc, B, *Bdesc, C, *Cdesc, D, *Ddesc);
  return CUBLAS_STATUS_SUCCESS;
}
