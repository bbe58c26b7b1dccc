// The checks the emulated cuBLASLt's heuristic and matmul share
// (emu/cublaslt_state.h): which products are emulated, and whether the
// layouts describe one.
#include <cstdio>
#include <string>

#include "emu/cublaslt_state.h"

namespace trainer::emu::cublaslt {

cublasStatus_t refuse(const char* call, cublasStatus_t status, const std::string& why) {
  std::fprintf(stderr, "%s (emulated cuBLASLt): %s\n", call, why.c_str());
  return status;
}

size_t element_bytes(int32_t type) {
  switch (type) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
  }
}

std::string type_name(int32_t type) {
  switch (type) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    default: return "cudaDataType " + std::to_string(type);
  }
}

namespace {

std::string dims(const cublasLtMatrixLayoutOpaque_t& l) {
  return std::to_string(l.rows) + " x " + std::to_string(l.cols);
}

const char* op_name(bool transposed) { return transposed ? "T" : "N"; }

// cuBLASLt's COMPUTE_32F table: fp32 scales, A and B of one type, C and D
// of A's type or fp32 (fp32 inputs: fp32 outputs).
cublasStatus_t check_types(const char* call, const cublasLtMatmulDescOpaque_t& desc,
                           const cublasLtMatrixLayoutOpaque_t& a, const cublasLtMatrixLayoutOpaque_t& b,
                           const cublasLtMatrixLayoutOpaque_t& c, const cublasLtMatrixLayoutOpaque_t& d) {
  if (desc.compute_type != CUBLAS_COMPUTE_32F)
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "compute type " + std::to_string(desc.compute_type) + " is not emulated (CUBLAS_COMPUTE_32F is)");
  if (desc.scale_type != CUDA_R_32F)
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "scale type " + type_name(desc.scale_type) + " is not emulated with CUBLAS_COMPUTE_32F (CUDA_R_32F is)");
  if (!element_bytes(a.type))
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "Adesc type " + type_name(a.type) + " is not emulated (CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F are)");
  if (b.type != a.type)
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "Bdesc type " + type_name(b.type) + " differs from Adesc type " + type_name(a.type));
  if (c.type != d.type)
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "Cdesc type " + type_name(c.type) + " differs from Ddesc type " + type_name(d.type));
  if (d.type != a.type && d.type != CUDA_R_32F)
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "Ddesc type " + type_name(d.type) + " with " + type_name(a.type) + " inputs: D must be " +
                      type_name(a.type) + " or CUDA_R_32F");
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_ops_and_epilogue(const char* call, const cublasLtMatmulDescOpaque_t& desc, Problem* p) {
  // For real types CUBLAS_OP_C is the transpose (cuBLAS's definition).
  for (int32_t op : {desc.transa, desc.transb})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
      return refuse(call, CUBLAS_STATUS_INVALID_VALUE,
                    std::string(op == desc.transa ? "TRANSA" : "TRANSB") + " is " + std::to_string(op) +
                        "; it must be CUBLAS_OP_N, CUBLAS_OP_T or CUBLAS_OP_C");
  p->a_transposed = desc.transa != CUBLAS_OP_N;
  p->b_transposed = desc.transb != CUBLAS_OP_N;
  if (desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT && desc.epilogue != CUBLASLT_EPILOGUE_BIAS)
    return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                  "epilogue " + std::to_string(desc.epilogue) +
                      " is not emulated (CUBLASLT_EPILOGUE_DEFAULT and CUBLASLT_EPILOGUE_BIAS are)");
  p->bias = desc.epilogue == CUBLASLT_EPILOGUE_BIAS;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t check_bias_type(const char* call, const cublasLtMatmulDescOpaque_t& desc,
                               const cublasLtMatrixLayoutOpaque_t& d) {
  if (desc.epilogue != CUBLASLT_EPILOGUE_BIAS || desc.bias_type == -1 || desc.bias_type == d.type)
    return CUBLAS_STATUS_SUCCESS;
  return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                "BIAS_DATA_TYPE " + type_name(desc.bias_type) + " is not emulated; the bias must have D's type " +
                    type_name(d.type));
}

// Column-major storage: a column of `rows` elements every `ld` elements.
cublasStatus_t check_ld(const char* call, const char* name, const cublasLtMatrixLayoutOpaque_t& l) {
  const uint64_t need = l.rows > 0 ? l.rows : 1;
  if (l.ld < 0 || uint64_t(l.ld) < need)
    return refuse(call, CUBLAS_STATUS_INVALID_VALUE,
                  std::string(name) + " is " + dims(l) + " (rows x cols) with leading dimension " +
                      std::to_string(l.ld) + "; it must be at least " + std::to_string(need) +
                      " (the rows of a column)");
  return CUBLAS_STATUS_SUCCESS;
}

// The stored shape an operand must have: op(X) is [r, c], so X is [r, c]
// untransposed, [c, r] transposed.
cublasStatus_t check_operand(const char* call, const char* name, const cublasLtMatrixLayoutOpaque_t& l,
                             bool transposed, uint64_t r, uint64_t c, const std::string& from) {
  const uint64_t want_rows = transposed ? c : r, want_cols = transposed ? r : c;
  if (l.rows == want_rows && l.cols == want_cols) return CUBLAS_STATUS_SUCCESS;
  return refuse(call, CUBLAS_STATUS_INVALID_VALUE,
                std::string(name) + " is " + dims(l) + " (rows x cols) but op=" + op_name(transposed) + " with " +
                    from + " needs " + std::to_string(want_rows) + " x " + std::to_string(want_cols));
}

cublasStatus_t check_shapes(const char* call, const cublasLtMatrixLayoutOpaque_t& a,
                            const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                            const cublasLtMatrixLayoutOpaque_t& d, Problem* p) {
  p->m = d.rows;
  p->n = d.cols;
  p->k = p->a_transposed ? a.rows : a.cols;
  const std::string mnk = "m=" + std::to_string(p->m) + ", n=" + std::to_string(p->n) + " (Ddesc) and k=" +
                          std::to_string(p->k) + " (Adesc)";
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  const char* names[4] = {"Adesc", "Bdesc", "Cdesc", "Ddesc"};
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {&a, &b, &c, &d};
  for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; ++i) s = check_ld(call, names[i], *layouts[i]);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_operand(call, "Adesc", a, p->a_transposed, p->m, p->k, mnk);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_operand(call, "Bdesc", b, p->b_transposed, p->k, p->n, mnk);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_operand(call, "Cdesc", c, false, p->m, p->n, mnk);
  return s;
}

bool live(const cublasLtMatrixLayoutOpaque_t* l) { return l && l->magic == kLayoutMagic; }

}  // namespace

cublasStatus_t check_problem(const char* call, cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                             cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                             cublasLtMatrixLayout_t d, Problem* out) {
  if (!handle || handle->magic != kHandleMagic)
    return refuse(call, CUBLAS_STATUS_NOT_INITIALIZED, "the handle is not one cublasLtCreate made (or destroyed)");
  if (!desc || desc->magic != kDescMagic)
    return refuse(call, CUBLAS_STATUS_INVALID_VALUE, "the matmul descriptor is not a live one");
  const char* names[4] = {"Adesc", "Bdesc", "Cdesc", "Ddesc"};
  const cublasLtMatrixLayoutOpaque_t* layouts[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i)
    if (!live(layouts[i]))
      return refuse(call, CUBLAS_STATUS_INVALID_VALUE, std::string(names[i]) + " is not a live matrix layout");
  Problem p;
  cublasStatus_t s = check_types(call, *desc, *a, *b, *c, *d);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_ops_and_epilogue(call, *desc, &p);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_bias_type(call, *desc, *d);
  if (s == CUBLAS_STATUS_SUCCESS) s = check_shapes(call, *a, *b, *c, *d, &p);
  if (s == CUBLAS_STATUS_SUCCESS) *out = p;
  return s;
}

}  // namespace trainer::emu::cublaslt
