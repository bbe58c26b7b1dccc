// What the emulated cuBLASLt's opaque handles hold (emu/cuda_shim/cublasLt.h
// declares them opaque), and the checks that the heuristic and the matmul
// share: both must refuse the same problems, or a plan that the heuristic
// accepted could fail only when it runs.
#pragma once

#include <cstdint>
#include <string>

#include "emu/cuda_shim/cublasLt.h"

// A magic word in each object turns a stale or foreign pointer into a clear
// error instead of a read of garbage.
struct cublasLtContext {
  uint64_t magic;
};

struct cublasLtMatmulDescOpaque_t {
  uint64_t magic;
  int32_t compute_type;
  int32_t scale_type;
  int32_t transa = CUBLAS_OP_N;
  int32_t transb = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // cuBLASLt's default: D's type
};

struct cublasLtMatrixLayoutOpaque_t {
  uint64_t magic;
  int32_t type;
  uint64_t rows, cols;
  int64_t ld;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t magic;
  uint64_t max_workspace_bytes = 0;
  // A, B, C, D: the pointer alignments the caller promises (cuBLASLt's
  // default is 256 bytes for each).
  uint32_t min_alignment[4] = {256, 256, 256, 256};
};

namespace trainer::emu::cublaslt {

inline constexpr uint64_t kHandleMagic = 0x63756c7448616e64ull;      // "cultHand"
inline constexpr uint64_t kDescMagic = 0x63756c7444657363ull;        // "cultDesc"
inline constexpr uint64_t kLayoutMagic = 0x63756c744c61796full;      // "cultLayo"
inline constexpr uint64_t kPreferenceMagic = 0x63756c7450726566ull;  // "cultPref"
inline constexpr uint64_t kAlgoMagic = 0x63756c74416c676full;        // "cultAlgo"

// Prints "CALL (emulated cuBLASLt): WHY" on stderr and returns `status`: the
// status alone cannot say which argument was wrong.
cublasStatus_t refuse(const char* call, cublasStatus_t status, const std::string& why);

// Bytes per element of a matrix type the emulator computes with, 0 for others.
size_t element_bytes(int32_t type);
std::string type_name(int32_t type);

// The product a descriptor and four layouts describe, once they are checked.
struct Problem {
  bool a_transposed = false, b_transposed = false;
  uint64_t m = 0, n = 0, k = 0;
  bool bias = false;  // EPILOGUE_BIAS: D += bias[row], bias in D's type
};

// Checks what cuBLASLt checks before it runs: the objects are live, the
// compute/scale/storage types and the epilogue are ones emulated, and the
// layouts' rows and columns agree with op(A) [m, k], op(B) [k, n], C and D
// [m, n] (m and n from D, k from A). On failure prints why and returns the
// status cuBLASLt gives (INVALID_VALUE for inconsistent arguments,
// NOT_SUPPORTED for combinations it has no kernel for).
cublasStatus_t check_problem(const char* call, cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                             cublasLtMatrixLayout_t d, Problem* out);

// D = alpha op(A) op(B) + beta C (+ bias) on host memory, column-major as
// cuBLAS defines it: see emu/cublaslt_matmul.cpp.
void run_matmul(const Problem& p, const cublasLtMatmulDescOpaque_t& desc, float alpha, float beta, const void* A,
                const cublasLtMatrixLayoutOpaque_t& a, const void* B, const cublasLtMatrixLayoutOpaque_t& b,
                const void* C, const cublasLtMatrixLayoutOpaque_t& c, void* D, const cublasLtMatrixLayoutOpaque_t& d);

}  // namespace trainer::emu::cublaslt
