// The emulated CUDA device's stand-ins for the libraries the CUDA module uses
// besides the runtime (emu/cuda_shim/): cuBLASLt's matmul against a plain
// loop written from cuBLAS's definition (every transpose pair, padded leading
// dimensions, each storage type, the bias epilogue, linear.cu's three
// products), and its refusals; cub::DeviceRadixSort::SortPairs against
// std::stable_sort (stability, bit ranges, the temporary-storage protocol);
// NCCL for one rank (each collective, groups of sends and receives, the
// refusal of two ranks).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "emu/bf16_bits.h"
#include "emu/cuda_shim/cub/device/device_radix_sort.cuh"
#include "emu/cuda_shim/cublasLt.h"
#include "emu/cuda_shim/nccl.h"

using namespace trainer::emu;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- cuBLASLt ------------------------------------------------------------------

// A column-major matrix of `type` elements, stored as raw bits in 32-bit
// slots (16-bit types use the low half of a uint16_t array).
struct Matrix {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
  std::vector<float> f32;
  std::vector<uint16_t> b16;

  Matrix(cudaDataType_t t, uint64_t r, uint64_t c, int64_t ld_) : type(t), rows(r), cols(c), ld(ld_) {
    const size_t n = size_t(ld_) * size_t(c);
    if (t == CUDA_R_32F)
      f32.assign(n, 0.f);
    else
      b16.assign(n, 0);
  }
  void* data() { return type == CUDA_R_32F ? static_cast<void*>(f32.data()) : b16.data(); }
  float get(uint64_t r, uint64_t c) const {
    const size_t i = size_t(r + c * uint64_t(ld));
    if (type == CUDA_R_32F) return f32[i];
    return type == CUDA_R_16BF ? bf16_to_float(b16[i]) : f16_to_float(b16[i]);
  }
  void set(uint64_t r, uint64_t c, float v) {
    const size_t i = size_t(r + c * uint64_t(ld));
    if (type == CUDA_R_32F)
      f32[i] = v;
    else
      b16[i] = type == CUDA_R_16BF ? float_to_bf16_rn(v) : float_to_f16_rn(v);
  }
  // Every slot, the padding rows between ld and rows included.
  void fill_all(float v) {
    for (uint64_t c = 0; c < cols; ++c)
      for (uint64_t r = 0; r < uint64_t(ld); ++r) set(r, c, v);
  }
  void fill_random(std::mt19937& rng) {
    std::uniform_int_distribution<int> d(-8, 8);
    for (uint64_t c = 0; c < cols; ++c)
      for (uint64_t r = 0; r < rows; ++r) set(r, c, float(d(rng)) * 0.125f + float(d(rng)) * 0.0078125f);
  }
};

// The stored shape of an operand whose op() is [r, c].
Matrix operand(cudaDataType_t type, bool transposed, uint64_t r, uint64_t c, int64_t pad) {
  const uint64_t rows = transposed ? c : r, cols = transposed ? r : c;
  return Matrix(type, rows, cols, int64_t(rows) + pad);
}

// cuBLAS's definition, element by element: op(A)[i, l] is A[i, l] or A[l, i].
float reference(const Matrix& A, bool ta, const Matrix& B, bool tb, const Matrix& C, uint64_t i, uint64_t j,
                uint64_t k, float alpha, float beta, const Matrix* bias) {
  double acc = 0;
  for (uint64_t l = 0; l < k; ++l) {
    const double a = ta ? A.get(l, i) : A.get(i, l);
    const double b = tb ? B.get(j, l) : B.get(l, j);
    acc += a * b;
  }
  double v = double(alpha) * acc;
  if (beta != 0) v += double(beta) * C.get(i, j);
  if (bias) v += bias->get(i, 0);
  return float(v);
}

// The stored value a float becomes in a matrix of `type` (RNE for 16 bits).
float stored(cudaDataType_t type, float v) {
  if (type == CUDA_R_32F) return v;
  return type == CUDA_R_16BF ? bf16_to_float(float_to_bf16_rn(v)) : f16_to_float(float_to_f16_rn(v));
}

struct Gemm {
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  uint64_t m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const void* bias = nullptr;
  int32_t bias_type = -1;
  uint32_t alignment = 16;  // what the preference promises for A, B, C, D
};

// The calls linear.cu makes, in its order: descriptor and attributes,
// layouts, preference, heuristic, matmul (D = C, one layout for both). The
// status of the first call that fails, with `where` naming it.
cublasStatus_t run_gemm(const Gemm& g, const Matrix& A, const Matrix& B, Matrix& C, std::string* where = nullptr) {
  cublasLtHandle_t h = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  auto step = [&](cublasStatus_t st, const char* name) {
    if (s == CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_SUCCESS) {
      s = st;
      if (where) *where = name;
    }
    return s == CUBLAS_STATUS_SUCCESS;
  };
  step(cublasLtCreate(&h), "create");
  step(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const int32_t ta = g.ta, tb = g.tb;
  step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  if (g.bias) {
    const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "epilogue");
    step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &g.bias_type, sizeof(int32_t)),
         "bias type");
    step(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)), "bias");
  }
  step(cublasLtMatrixLayoutCreate(&la, A.type, A.rows, A.cols, A.ld), "layout A");
  step(cublasLtMatrixLayoutCreate(&lb, B.type, B.rows, B.cols, B.ld), "layout B");
  step(cublasLtMatrixLayoutCreate(&lc, C.type, C.rows, C.cols, C.ld), "layout C");
  step(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const uint64_t ws = 1 << 20;
  step(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "ws");
  for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    step(cublasLtMatmulPreferenceSetAttribute(pref, a, &g.alignment, sizeof(g.alignment)), "alignment");
  cublasLtMatmulHeuristicResult_t result{};
  int returned = -1;
  if (step(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &result, &returned), "heuristic")) {
    REQUIRE(returned == 1);
    REQUIRE(result.state == CUBLAS_STATUS_SUCCESS);
  }
  std::vector<char> workspace(ws);
  step(cublasLtMatmul(h, desc, &g.alpha, const_cast<Matrix&>(A).data(), la, const_cast<Matrix&>(B).data(), lb,
                      &g.beta, C.data(), lc, C.data(), lc, &result.algo, workspace.data(), ws, nullptr),
       "matmul");
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  return s;
}

// One product checked element by element against the reference (bitwise:
// both sum the same fp32 products in double in k order), the padding rows of
// C untouched.
// m = 7 is one block of four rows and three single ones (emu/cublaslt_matmul.cpp).
void check_gemm(cudaDataType_t ab, cudaDataType_t cd, bool ta, bool tb, float beta, const Matrix* bias = nullptr,
                uint64_t m = 7, uint64_t n = 5, uint64_t k = 9) {
  std::mt19937 rng(unsigned(ab * 1000 + cd * 100 + ta * 10 + tb));
  Gemm g;
  g.ta = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.tb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  g.m = m, g.n = n, g.k = k;
  g.alpha = 0.75f;
  g.beta = beta;
  Matrix A = operand(ab, ta, g.m, g.k, 3), B = operand(ab, tb, g.k, g.n, 2);
  Matrix C(cd, g.m, g.n, int64_t(g.m) + 4);
  C.fill_all(-99.f);  // padding rows keep this
  A.fill_random(rng);
  B.fill_random(rng);
  C.fill_random(rng);
  if (bias) {
    g.bias = const_cast<Matrix*>(bias)->data();
    g.bias_type = bias->type;
  }
  const Matrix C0 = C;
  REQUIRE(run_gemm(g, A, B, C) == CUBLAS_STATUS_SUCCESS);
  for (uint64_t j = 0; j < g.n; ++j) {
    for (uint64_t i = 0; i < g.m; ++i) {
      INFO("ta=" << ta << " tb=" << tb << " i=" << i << " j=" << j);
      REQUIRE(C.get(i, j) == stored(cd, reference(A, ta, B, tb, C0, i, j, g.k, g.alpha, beta, bias)));
    }
    for (uint64_t r = g.m; r < uint64_t(C.ld); ++r) REQUIRE(C.get(r, j) == stored(cd, -99.f));
  }
}

TEST_CASE("emu cuBLASLt computes cuBLAS's column-major product for every transpose pair", "[emu][cublaslt]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm(CUDA_R_32F, CUDA_R_32F, ta, tb, 0.f);
      check_gemm(CUDA_R_32F, CUDA_R_32F, ta, tb, 1.f);
      check_gemm(CUDA_R_32F, CUDA_R_32F, ta, tb, -0.5f);
    }
}

TEST_CASE("emu cuBLASLt gives the same bits when a large product is split over threads", "[emu][cublaslt]") {
  // 2^24 multiply-adds: the columns go to several host threads.
  check_gemm(CUDA_R_32F, CUDA_R_32F, true, false, 1.f, nullptr, 258, 251, 259);
  check_gemm(CUDA_R_16BF, CUDA_R_16BF, false, true, 0.f, nullptr, 258, 251, 259);
}

TEST_CASE("emu cuBLASLt reads and rounds each storage type", "[emu][cublaslt]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm(CUDA_R_16BF, CUDA_R_16BF, ta, tb, 1.f);
      check_gemm(CUDA_R_16BF, CUDA_R_32F, ta, tb, 1.f);
      check_gemm(CUDA_R_16F, CUDA_R_16F, ta, tb, 0.f);
      check_gemm(CUDA_R_16F, CUDA_R_32F, ta, tb, 1.f);
    }
}

TEST_CASE("emu cuBLASLt rounds 16-bit outputs to nearest even from the fp32 result", "[emu][cublaslt]") {
  // 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: even is 1.
  Gemm g;
  g.m = g.n = g.k = 1;
  Matrix A(CUDA_R_32F, 1, 1, 1), B(CUDA_R_32F, 1, 1, 1);
  A.set(0, 0, 1.f + 0x1p-8f);
  B.set(0, 0, 1.f);
  Matrix C32(CUDA_R_32F, 1, 1, 1);
  REQUIRE(run_gemm(g, A, B, C32) == CUBLAS_STATUS_SUCCESS);
  CHECK(C32.get(0, 0) == 1.f + 0x1p-8f);
  Matrix Ab(CUDA_R_16BF, 1, 1, 1), Bb(CUDA_R_16BF, 1, 1, 1), Cb(CUDA_R_16BF, 1, 1, 1);
  Ab.set(0, 0, 1.f + 0x1p-7f);  // exact in bf16
  Bb.set(0, 0, 0.5f);
  g.alpha = 2.f;
  g.beta = 1.f;
  Cb.set(0, 0, 0.f);
  // 2 * (1 + 2^-7) * 0.5 + 0 = 1 + 2^-7: exact.
  REQUIRE(run_gemm(g, Ab, Bb, Cb) == CUBLAS_STATUS_SUCCESS);
  CHECK(Cb.get(0, 0) == 1.f + 0x1p-7f);
  // (1 + 2^-7) * 0.5 * 2 + 2^-8 = 1 + 3 * 2^-8: halfway between 1 + 2^-7 and
  // 1 + 2^-6; even is 1 + 2^-6.
  Cb.set(0, 0, 0x1p-8f);
  REQUIRE(run_gemm(g, Ab, Bb, Cb) == CUBLAS_STATUS_SUCCESS);
  CHECK(Cb.get(0, 0) == 1.f + 0x1p-6f);
}

TEST_CASE("emu cuBLASLt's bias epilogue adds bias[row] in D's type", "[emu][cublaslt]") {
  for (cudaDataType_t t : {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F}) {
    Matrix bias(t, 7, 1, 7);
    for (uint64_t i = 0; i < 7; ++i) bias.set(i, 0, float(i) - 2.5f);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) check_gemm(t, t, ta, tb, 0.f, &bias);
  }
}

TEST_CASE("emu cuBLASLt does not read C when beta is 0", "[emu][cublaslt]") {
  Gemm g;
  g.m = 2, g.n = 2, g.k = 1;
  Matrix A(CUDA_R_32F, 2, 1, 2), B(CUDA_R_32F, 1, 2, 1), C(CUDA_R_32F, 2, 2, 2);
  A.set(0, 0, 1), A.set(1, 0, 2), B.set(0, 0, 3), B.set(0, 1, 4);
  C.fill_all(std::numeric_limits<float>::quiet_NaN());
  REQUIRE(run_gemm(g, A, B, C) == CUBLAS_STATUS_SUCCESS);
  // The outer product [1, 2]^T [3, 4].
  CHECK(C.get(0, 0) == 3);
  CHECK(C.get(1, 0) == 6);
  CHECK(C.get(0, 1) == 4);
  CHECK(C.get(1, 1) == 8);
}

// Row-major tensors, as linear.cu holds them: inp [N, IC], weight [OC, IC],
// out [N, OC]. Its three products through cuBLASLt against plain row-major loops.
TEST_CASE("emu cuBLASLt runs linear.cu's forward, dinp and dweight products", "[emu][cublaslt]") {
  const uint64_t N = 6, IC = 5, OC = 4;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> d(-4, 4);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = float(d(rng)) * 0.25f;
    return v;
  };
  const std::vector<float> inp = random(N * IC), weight = random(OC * IC), dout = random(N * OC);
  auto as_matrix = [](const std::vector<float>& v, uint64_t rows, uint64_t cols) {
    Matrix m(CUDA_R_32F, rows, cols, int64_t(rows));
    m.f32 = v;
    return m;
  };
  SECTION("forward: out = inp @ weight^T") {
    Gemm g;
    g.ta = CUBLAS_OP_T, g.m = OC, g.n = N, g.k = IC;
    Matrix out(CUDA_R_32F, OC, N, OC);
    REQUIRE(run_gemm(g, as_matrix(weight, IC, OC), as_matrix(inp, IC, N), out) == CUBLAS_STATUS_SUCCESS);
    for (uint64_t n = 0; n < N; ++n)
      for (uint64_t o = 0; o < OC; ++o) {
        double s = 0;
        for (uint64_t c = 0; c < IC; ++c) s += double(inp[n * IC + c]) * weight[o * IC + c];
        REQUIRE(out.f32[n * OC + o] == float(s));
      }
  }
  SECTION("dinp = dout @ weight") {
    Gemm g;
    g.m = IC, g.n = N, g.k = OC;
    Matrix dinp(CUDA_R_32F, IC, N, IC);
    REQUIRE(run_gemm(g, as_matrix(weight, IC, OC), as_matrix(dout, OC, N), dinp) == CUBLAS_STATUS_SUCCESS);
    for (uint64_t n = 0; n < N; ++n)
      for (uint64_t c = 0; c < IC; ++c) {
        double s = 0;
        for (uint64_t o = 0; o < OC; ++o) s += double(dout[n * OC + o]) * weight[o * IC + c];
        REQUIRE(dinp.f32[n * IC + c] == float(s));
      }
  }
  SECTION("dweight += dout^T @ inp") {
    Gemm g;
    g.tb = CUBLAS_OP_T, g.m = IC, g.n = OC, g.k = N, g.beta = 1;
    Matrix dw = as_matrix(random(OC * IC), IC, OC);
    const std::vector<float> before = dw.f32;
    REQUIRE(run_gemm(g, as_matrix(inp, IC, N), as_matrix(dout, OC, N), dw) == CUBLAS_STATUS_SUCCESS);
    for (uint64_t o = 0; o < OC; ++o)
      for (uint64_t c = 0; c < IC; ++c) {
        double s = 0;
        for (uint64_t n = 0; n < N; ++n) s += double(dout[n * OC + o]) * inp[n * IC + c];
        REQUIRE(dw.f32[o * IC + c] == float(s + before[o * IC + c]));
      }
  }
}

TEST_CASE("emu cuBLASLt refuses layouts that disagree with m, n, k and the transposes", "[emu][cublaslt]") {
  Gemm g;
  g.ta = CUBLAS_OP_T, g.m = 4, g.n = 3, g.k = 5;
  Matrix B(CUDA_R_32F, 5, 3, 5), C(CUDA_R_32F, 4, 3, 4);
  std::string where;
  SECTION("A stored as op(A), not as A") {
    Matrix A(CUDA_R_32F, 4, 6, 4);  // op T needs A stored k x m = 5 x 4; 4 x 6 gives k = 4 and m = 6 != 4
    CHECK(run_gemm(g, A, B, C, &where) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(where == "heuristic");
  }
  SECTION("B's rows are not k") {
    Matrix A(CUDA_R_32F, 5, 4, 5);
    Matrix B4(CUDA_R_32F, 4, 3, 4);
    CHECK(run_gemm(g, A, B4, C, &where) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("a leading dimension below the rows") {
    Matrix A(CUDA_R_32F, 5, 4, 5);
    A.ld = 3;
    CHECK(run_gemm(g, A, B, C, &where) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("C's type differs from A's and is not fp32") {
    Matrix A(CUDA_R_16BF, 5, 4, 5), Bb(CUDA_R_16BF, 5, 3, 5), Ch(CUDA_R_16F, 4, 3, 4);
    CHECK(run_gemm(g, A, Bb, Ch, &where) == CUBLAS_STATUS_NOT_SUPPORTED);
  }
  SECTION("a bias of another type than D") {
    Matrix A(CUDA_R_32F, 5, 4, 5), bias(CUDA_R_16BF, 4, 1, 4);
    g.bias = bias.data();
    g.bias_type = CUDA_R_16BF;
    CHECK(run_gemm(g, A, B, C, &where) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(where == "heuristic");
  }
  SECTION("an alignment promise below the element size finds no algorithm") {
    Matrix A(CUDA_R_32F, 5, 4, 5);
    g.alignment = 2;
    CHECK(run_gemm(g, A, B, C, &where) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(where == "heuristic");
  }
}

TEST_CASE("emu cuBLASLt checks attribute sizes, pointers and the promised alignment", "[emu][cublaslt]") {
  cublasLtMatmulDesc_t desc = nullptr;
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  const int64_t wide = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof(wide)) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmulDescDestroy(desc) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasLtGetVersion() > 0);

  // A pointer 4-byte aligned where the algorithm was chosen for 16.
  cublasLtHandle_t h = nullptr;
  REQUIRE(cublasLtCreate(&h) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayout_t l = nullptr;
  REQUIRE(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 2, 2, 2) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t pref = nullptr;
  REQUIRE(cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS);
  const uint32_t al = 16;
  for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    REQUIRE(cublasLtMatmulPreferenceSetAttribute(pref, a, &al, sizeof(al)) == CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulHeuristicResult_t r{};
  int n = 0;
  REQUIRE(cublasLtMatmulAlgoGetHeuristic(h, desc, l, l, l, l, pref, 1, &r, &n) == CUBLAS_STATUS_SUCCESS);
  alignas(256) float buf[4 * 8] = {};
  const float one = 1, zero = 0;
  CHECK(cublasLtMatmul(h, desc, &one, buf + 1, l, buf + 8, l, &zero, buf + 16, l, buf + 16, l, &r.algo, nullptr, 0,
                       nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmul(h, desc, &one, buf, l, buf + 8, l, &zero, buf + 16, l, buf + 16, l, &r.algo, nullptr, 0,
                       nullptr) == CUBLAS_STATUS_SUCCESS);
  // D over B: cuBLASLt computes in place into C only.
  CHECK(cublasLtMatmul(h, desc, &one, buf, l, buf + 8, l, &zero, buf + 8, l, buf + 8, l, &r.algo, nullptr, 0,
                       nullptr) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasLtMatmul(nullptr, desc, &one, buf, l, buf + 8, l, &zero, buf + 16, l, buf + 16, l, &r.algo, nullptr, 0,
                       nullptr) == CUBLAS_STATUS_NOT_INITIALIZED);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
}

// ---- cub::DeviceRadixSort::SortPairs ----------------------------------------------

template <typename K, typename V>
struct Sorted {
  std::vector<K> keys;
  std::vector<V> values;
};

// The two-call protocol, as embedding.cu runs it.
template <typename K, typename V>
Sorted<K, V> radix_sort(const std::vector<K>& keys, const std::vector<V>& values, int begin_bit, int end_bit) {
  size_t bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const K*>(nullptr), static_cast<K*>(nullptr),
                                          static_cast<const V*>(nullptr), static_cast<V*>(nullptr), int(keys.size()),
                                          begin_bit, end_bit, cudaStream_t(nullptr)) == cudaSuccess);
  REQUIRE(bytes > 0);
  std::vector<unsigned char> temp(bytes);
  Sorted<K, V> out{std::vector<K>(keys.size()), std::vector<V>(values.size())};
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), out.keys.data(), values.data(),
                                          out.values.data(), int(keys.size()), begin_bit, end_bit) == cudaSuccess);
  return out;
}

// std::stable_sort by the bits [begin_bit, end_bit) of the key.
template <typename K, typename V>
Sorted<K, V> stable_reference(const std::vector<K>& keys, const std::vector<V>& values, int begin_bit, int end_bit) {
  std::vector<size_t> order(keys.size());
  std::iota(order.begin(), order.end(), size_t(0));
  const int width = end_bit - begin_bit;
  const uint64_t mask = width >= 64 ? ~uint64_t(0) : (uint64_t(1) << width) - 1;
  auto bits = [&](size_t i) { return (uint64_t(keys[i]) >> begin_bit) & mask; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bits(a) < bits(b); });
  Sorted<K, V> out;
  for (size_t i : order) {
    out.keys.push_back(keys[i]);
    out.values.push_back(values[i]);
  }
  return out;
}

TEST_CASE("emu cub SortPairs is a stable sort, as embedding.cu relies on", "[emu][cub]") {
  std::mt19937 rng(3);
  const uint32_t rows = 37;  // keys 0..rows, `rows` marking ids held elsewhere
  std::vector<uint32_t> keys(5000);
  std::vector<int32_t> positions(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = rng() % (rows + 1);
    positions[i] = int32_t(i);
  }
  int end_bit = 1;
  while (end_bit < 32 && (uint64_t(1) << end_bit) <= rows) ++end_bit;  // embedding.cu's bit count
  const auto got = radix_sort(keys, positions, 0, end_bit);
  const auto want = stable_reference(keys, positions, 0, end_bit);
  CHECK(got.keys == want.keys);
  CHECK(got.values == want.values);
  for (size_t i = 1; i < keys.size(); ++i)
    if (got.keys[i] == got.keys[i - 1]) REQUIRE(got.values[i] > got.values[i - 1]);
}

TEST_CASE("emu cub SortPairs orders by the bit range only and outputs whole keys", "[emu][cub]") {
  std::mt19937 rng(5);
  std::vector<uint32_t> keys(3000);
  std::vector<uint16_t> values(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = uint32_t(rng());
    values[i] = uint16_t(i);
  }
  for (auto [b, e] : {std::pair{0, 32}, std::pair{0, 4}, std::pair{4, 13}, std::pair{20, 32}, std::pair{7, 7}}) {
    INFO("bits [" << b << ", " << e << ")");
    const auto got = radix_sort(keys, values, b, e);
    const auto want = stable_reference(keys, values, b, e);
    CHECK(got.keys == want.keys);
    CHECK(got.values == want.values);
  }
  // Other key widths, with 8-byte values.
  std::vector<uint64_t> k64(500);
  std::vector<uint8_t> k8(500);
  std::vector<double> v(500);
  for (size_t i = 0; i < k64.size(); ++i) {
    k64[i] = (uint64_t(rng()) << 32) | rng();
    k8[i] = uint8_t(rng());
    v[i] = double(i);
  }
  CHECK(radix_sort(k64, v, 0, 64).keys == stable_reference(k64, v, 0, 64).keys);
  CHECK(radix_sort(k64, v, 33, 61).values == stable_reference(k64, v, 33, 61).values);
  CHECK(radix_sort(k8, v, 0, 8).values == stable_reference(k8, v, 0, 8).values);
}

TEST_CASE("emu cub SortPairs follows CUB's temporary-storage protocol", "[emu][cub]") {
  std::vector<uint32_t> keys = {5, 3, 5, 1}, keys_out(4, 77);
  std::vector<int32_t> vals = {0, 1, 2, 3}, vals_out(4, 77);
  size_t bytes = 0;
  SECTION("the size query sorts nothing") {
    REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.data(), keys_out.data(), vals.data(),
                                            vals_out.data(), 4) == cudaSuccess);
    CHECK(bytes > 0);
    CHECK(keys_out == std::vector<uint32_t>(4, 77));
  }
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.data(), keys_out.data(), vals.data(), vals_out.data(),
                                          4) == cudaSuccess);
  std::vector<unsigned char> temp(bytes + 1);
  SECTION("less storage than asked is refused") {
    size_t less = bytes - 1;
    CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), less, keys.data(), keys_out.data(), vals.data(),
                                          vals_out.data(), 4) == cudaErrorInvalidValue);
  }
  SECTION("the bytes asked for suffice wherever they start") {
    CHECK(cub::DeviceRadixSort::SortPairs(temp.data() + 1, bytes, keys.data(), keys_out.data(), vals.data(),
                                          vals_out.data(), 4) == cudaSuccess);
    CHECK(keys_out == std::vector<uint32_t>{1, 3, 5, 5});
    CHECK(vals_out == std::vector<int32_t>{3, 1, 0, 2});
  }
  SECTION("in place and bad bit ranges are refused") {
    CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys.data(), vals.data(), vals_out.data(),
                                          4) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys_out.data(), vals.data(),
                                          vals_out.data(), 4, 0, 33) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp.data(), bytes, keys.data(), keys_out.data(), vals.data(),
                                          vals_out.data(), 4, 9, 8) == cudaErrorInvalidValue);
  }
}

// ---- NCCL for one rank ----------------------------------------------------------

ncclComm_t one_rank() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  REQUIRE(comm != nullptr);
  return comm;
}

TEST_CASE("emu NCCL makes one-rank communicators and refuses more ranks", "[emu][nccl]") {
  ncclComm_t comm = one_rank();
  int n = 0, r = -1;
  CHECK(ncclCommCount(comm, &n) == ncclSuccess);
  CHECK(ncclCommUserRank(comm, &r) == ncclSuccess);
  CHECK((n == 1 && r == 0));
  ncclResult_t async = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclSuccess);
  int v = 0;
  CHECK(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);
  CHECK(v == 22800);

  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t two = reinterpret_cast<ncclComm_t>(&n);
  CHECK(ncclCommInitRank(&two, 2, id, 0) == ncclInvalidUsage);
  CHECK(two == nullptr);
  const std::string why = ncclGetLastError(nullptr);
  CHECK(contains(why, "the emulated CUDA device runs NCCL for one rank only; use parallel.backend: host for more ranks"));
  CHECK(ncclCommInitRank(&two, 1, id, 1) == ncclInvalidArgument);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclComm_t configured = nullptr;
  CHECK(ncclCommInitRankConfig(&configured, 1, id, 0, &config) == ncclSuccess);
  ncclConfig_t raw{};
  ncclComm_t unconfigured = nullptr;
  CHECK(ncclCommInitRankConfig(&unconfigured, 1, id, 0, &raw) == ncclInvalidArgument);

  ncclComm_t child = nullptr, none = comm;
  CHECK(ncclCommSplit(comm, 3, 0, &child, &config) == ncclSuccess);
  CHECK(ncclCommCount(child, &n) == ncclSuccess);
  CHECK(n == 1);
  CHECK(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr) == ncclSuccess);
  CHECK(none == nullptr);
  CHECK(ncclCommAbort(child) == ncclSuccess);
  CHECK(ncclCommDestroy(configured) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(std::string(ncclGetErrorString(ncclInvalidUsage)).size() > 0);
}

TEST_CASE("emu NCCL collectives of one rank copy their one input", "[emu][nccl]") {
  ncclComm_t comm = one_rank();
  std::vector<float> f = {1.5f, -2.f, 3.25f}, g(3, 0.f);
  CHECK(ncclAllReduce(f.data(), g.data(), 3, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(g == f);
  CHECK(ncclAllReduce(f.data(), f.data(), 3, ncclFloat32, ncclMax, comm, nullptr) == ncclSuccess);
  CHECK(f == std::vector<float>{1.5f, -2.f, 3.25f});
  // The types comm/nccl_communicator.cpp reduces, as raw bits.
  std::vector<uint16_t> bf = {float_to_bf16_rn(0.1f), 0x8001, 0x7fc0}, bf_out(3);
  CHECK(ncclAllReduce(bf.data(), bf_out.data(), 3, ncclBfloat16, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(bf_out == bf);
  std::vector<uint16_t> h_out(3);
  CHECK(ncclAllReduce(bf.data(), h_out.data(), 3, ncclFloat16, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(h_out == bf);
  std::vector<double> d = {1e300, -0.0}, d_out(2);
  CHECK(ncclAllReduce(d.data(), d_out.data(), 2, ncclFloat64, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(std::memcmp(d.data(), d_out.data(), sizeof(double) * 2) == 0);
  std::vector<int32_t> i = {7, -1}, i_out(2);
  CHECK(ncclAllReduce(i.data(), i_out.data(), 2, ncclInt32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(i_out == i);
  std::vector<uint32_t> u = {0xffffffffu, 1}, u_out(2);
  CHECK(ncclAllReduce(u.data(), u_out.data(), 2, ncclUint32, ncclMax, comm, nullptr) == ncclSuccess);
  CHECK(u_out == u);

  std::vector<float> rs(3);
  CHECK(ncclReduceScatter(f.data(), rs.data(), 3, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(rs == f);
  std::vector<unsigned char> bytes = {1, 2, 3, 4, 5}, gathered(5);
  CHECK(ncclAllGather(bytes.data(), gathered.data(), 5, ncclUint8, comm, nullptr) == ncclSuccess);
  CHECK(gathered == bytes);
  CHECK(ncclAllGather(bytes.data(), bytes.data(), 5, ncclUint8, comm, nullptr) == ncclSuccess);  // in place
  std::vector<unsigned char> b_out(5);
  CHECK(ncclBroadcast(bytes.data(), b_out.data(), 5, ncclUint8, 0, comm, nullptr) == ncclSuccess);
  CHECK(b_out == bytes);
  int32_t word = 0;  // comm/nccl_communicator.cpp's barrier
  CHECK(ncclAllReduce(&word, &word, 1, ncclInt32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("emu NCCL refuses what NCCL refuses", "[emu][nccl]") {
  ncclComm_t comm = one_rank();
  std::vector<float> f(4, 1.f), g(4);
  CHECK(ncclBroadcast(f.data(), g.data(), 4, ncclFloat32, 1, comm, nullptr) == ncclInvalidArgument);
  CHECK(contains(ncclGetLastError(comm), "root 1"));
  CHECK(ncclAllReduce(f.data(), g.data(), 4, ncclDataType_t(42), ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(f.data(), g.data(), 4, ncclFloat32, ncclRedOp_t(9), comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(f.data(), nullptr, 4, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(f.data(), f.data() + 1, 3, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(f.data(), g.data(), 0, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(ncclAllReduce(f.data(), g.data(), 4, ncclFloat32, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

TEST_CASE("emu NCCL pairs a group's sends to itself with its receives", "[emu][nccl]") {
  ncclComm_t comm = one_rank();
  std::vector<int32_t> in = {1, 2, 3, 4, 5, 6}, out(6, 0);
  SECTION("all_to_all's pattern: the n-th send feeds the n-th receive") {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(in.data(), 8, ncclUint8, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclRecv(out.data() + 4, 8, ncclUint8, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclSend(in.data() + 2, 4, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclRecv(out.data(), 4, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    CHECK(out == std::vector<int32_t>(6, 0));  // nothing moves before the group ends
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    CHECK(out == std::vector<int32_t>{3, 4, 5, 6, 1, 2});
  }
  SECTION("nested groups run at the outermost end") {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    CHECK(ncclRecv(out.data(), 6, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    CHECK(ncclSend(in.data(), 6, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    CHECK(out == in);
  }
  SECTION("sizes that differ are refused and nothing moves") {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(in.data(), 2, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclRecv(out.data(), 3, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    CHECK(out == std::vector<int32_t>(6, 0));
  }
  SECTION("a send without its receive is refused") {
    REQUIRE(ncclGroupStart() == ncclSuccess);
    CHECK(ncclSend(in.data(), 2, ncclInt32, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
  }
  SECTION("outside a group a send to itself could never complete") {
    CHECK(ncclSend(in.data(), 2, ncclInt32, 0, comm, nullptr) == ncclInvalidUsage);
    CHECK(ncclRecv(out.data(), 2, ncclInt32, 1, comm, nullptr) == ncclInvalidArgument);
  }
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
}

}  // namespace
