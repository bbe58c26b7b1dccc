// The emulated cuBLASLt's objects: the handle, matmul descriptors, matrix
// layouts and preferences (emu/cuda_shim/cublasLt.h). Setting an attribute
// only stores it; the values are checked where they are used
// (check_problem), so a bad one is reported with the whole problem in view.
#include <cstring>
#include <new>
#include <string>

#include "emu/cublaslt_state.h"

namespace trainer::emu::cublaslt {
namespace {

// cuBLAS 13.1.0, the toolkit whose header the enum values were taken from.
constexpr size_t kEmulatedVersion = 13 * 10000 + 1 * 100 + 0;

// Allocates an object with its magic word set, as cuBLASLt's Create calls do.
template <typename T>
cublasStatus_t create(const char* call, const char* what, T** out, uint64_t magic) {
  if (!out) return refuse(call, CUBLAS_STATUS_INVALID_VALUE, std::string("the ") + what + " pointer is null");
  T* object = new (std::nothrow) T{};
  if (!object) return refuse(call, CUBLAS_STATUS_ALLOC_FAILED, std::string("no memory for a ") + what);
  object->magic = magic;
  *out = object;
  return CUBLAS_STATUS_SUCCESS;
}

// Destroying null is allowed (as cuBLASLt allows it); the magic is cleared
// first so a use after destroy is more likely caught than read.
template <typename T>
cublasStatus_t destroy(const char* call, T* object, uint64_t magic) {
  if (!object) return CUBLAS_STATUS_SUCCESS;
  if (object->magic != magic)
    return refuse(call, CUBLAS_STATUS_INVALID_VALUE, "the object is not a live one of this kind (destroyed twice?)");
  object->magic = 0;
  delete object;
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLASLt refuses an attribute buffer whose size is not the attribute's.
template <typename T>
cublasStatus_t set_field(const char* call, const char* attribute, T& field, const void* buf, size_t bytes) {
  if (!buf) return refuse(call, CUBLAS_STATUS_INVALID_VALUE, std::string(attribute) + ": the value pointer is null");
  if (bytes != sizeof(T))
    return refuse(call, CUBLAS_STATUS_INVALID_VALUE,
                  std::string(attribute) + ": sizeInBytes is " + std::to_string(bytes) + ", the attribute holds " +
                      std::to_string(sizeof(T)));
  std::memcpy(&field, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t set_desc(cublasLtMatmulDescOpaque_t& d, cublasLtMatmulDescAttributes_t attr, const void* buf,
                        size_t bytes) {
  const char* call = "cublasLtMatmulDescSetAttribute";
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return set_field(call, "COMPUTE_TYPE", d.compute_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return set_field(call, "SCALE_TYPE", d.scale_type, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSA: return set_field(call, "TRANSA", d.transa, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return set_field(call, "TRANSB", d.transb, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return set_field(call, "EPILOGUE", d.epilogue, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set_field(call, "BIAS_POINTER", d.bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set_field(call, "BIAS_DATA_TYPE", d.bias_type, buf, bytes);
    default:
      return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                    "attribute " + std::to_string(int(attr)) +
                        " is not emulated (COMPUTE_TYPE, SCALE_TYPE, TRANSA, TRANSB, EPILOGUE, BIAS_POINTER and "
                        "BIAS_DATA_TYPE are)");
  }
}

cublasStatus_t set_preference(cublasLtMatmulPreferenceOpaque_t& p, cublasLtMatmulPreferenceAttributes_t attr,
                              const void* buf, size_t bytes) {
  const char* call = "cublasLtMatmulPreferenceSetAttribute";
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      return set_field(call, "MAX_WORKSPACE_BYTES", p.max_workspace_bytes, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_field(call, "MIN_ALIGNMENT_A_BYTES", p.min_alignment[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_field(call, "MIN_ALIGNMENT_B_BYTES", p.min_alignment[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_field(call, "MIN_ALIGNMENT_C_BYTES", p.min_alignment[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_field(call, "MIN_ALIGNMENT_D_BYTES", p.min_alignment[3], buf, bytes);
    default:
      return refuse(call, CUBLAS_STATUS_NOT_SUPPORTED,
                    "attribute " + std::to_string(int(attr)) +
                        " is not emulated (MAX_WORKSPACE_BYTES and MIN_ALIGNMENT_{A,B,C,D}_BYTES are)");
  }
}

bool live(const cublasLtMatmulDescOpaque_t* d) { return d && d->magic == kDescMagic; }
bool live(const cublasLtMatmulPreferenceOpaque_t* p) { return p && p->magic == kPreferenceMagic; }

}  // namespace
}  // namespace trainer::emu::cublaslt

using namespace trainer::emu::cublaslt;

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  return create("cublasLtCreate", "handle", lightHandle, kHandleMagic);
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  return destroy("cublasLtDestroy", lightHandle, kHandleMagic);
}

size_t cublasLtGetVersion(void) { return kEmulatedVersion; }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  const cublasStatus_t s = create("cublasLtMatmulDescCreate", "matmul descriptor", matmulDesc, kDescMagic);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  (*matmulDesc)->compute_type = computeType;
  (*matmulDesc)->scale_type = scaleType;
  return s;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return destroy("cublasLtMatmulDescDestroy", matmulDesc, kDescMagic);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  if (!live(matmulDesc))
    return refuse("cublasLtMatmulDescSetAttribute", CUBLAS_STATUS_INVALID_VALUE,
                  "matmulDesc is not a live matmul descriptor");
  return set_desc(*matmulDesc, attr, buf, sizeInBytes);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  const cublasStatus_t s = create("cublasLtMatrixLayoutCreate", "matrix layout", matLayout, kLayoutMagic);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  (*matLayout)->type = type;
  (*matLayout)->rows = rows;
  (*matLayout)->cols = cols;
  (*matLayout)->ld = ld;
  return s;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return destroy("cublasLtMatrixLayoutDestroy", matLayout, kLayoutMagic);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  return create("cublasLtMatmulPreferenceCreate", "preference", pref, kPreferenceMagic);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroy("cublasLtMatmulPreferenceDestroy", pref, kPreferenceMagic);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t sizeInBytes) {
  if (!live(pref))
    return refuse("cublasLtMatmulPreferenceSetAttribute", CUBLAS_STATUS_INVALID_VALUE,
                  "pref is not a live matmul preference");
  return set_preference(*pref, attr, buf, sizeInBytes);
}

}  // extern "C"
