// cublasLtMatmulAlgoGetHeuristic of the emulated cuBLASLt: one algorithm, the
// reference loop, for every problem the emulator computes. The algorithm
// remembers the pointer alignments the preference promised, so that
// cublasLtMatmul can refuse pointers less aligned than that: on a GPU the
// chosen kernel would fault or read wrong data there.
#include <string>

#include "emu/cublaslt_state.h"

namespace trainer::emu::cublaslt {
namespace {

const char* kCall = "cublasLtMatmulAlgoGetHeuristic";

// cuBLASLt offers no algorithm for an operand whose promised alignment is
// below its element size (every kernel loads whole elements).
cublasStatus_t check_alignments(const cublasLtMatmulPreferenceOpaque_t& pref, const int32_t types[4]) {
  const char* names[4] = {"A", "B", "C", "D"};
  for (int i = 0; i < 4; ++i) {
    const uint32_t al = pref.min_alignment[i];
    const size_t elem = element_bytes(types[i]);
    if (al == 0 || (al & (al - 1)) != 0 || al < elem)
      return refuse(kCall, CUBLAS_STATUS_NOT_SUPPORTED,
                    std::string("no algorithm: MIN_ALIGNMENT_") + names[i] + "_BYTES is " + std::to_string(al) +
                        "; it must be a power of two of at least the " + std::to_string(elem) + "-byte elements of " +
                        type_name(types[i]));
  }
  return CUBLAS_STATUS_SUCCESS;
}

void fill_result(const cublasLtMatmulPreferenceOpaque_t& pref, cublasLtMatmulHeuristicResult_t* r) {
  *r = cublasLtMatmulHeuristicResult_t{};
  r->algo.data[0] = kAlgoMagic;
  for (int i = 0; i < 4; ++i) r->algo.data[1 + i] = pref.min_alignment[i];
  r->workspaceSize = 0;  // the reference loop needs none
  r->state = CUBLAS_STATUS_SUCCESS;
  r->wavesCount = 1.0f;
}

}  // namespace
}  // namespace trainer::emu::cublaslt

using namespace trainer::emu::cublaslt;

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  if (!returnAlgoCount) return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, "returnAlgoCount is null");
  *returnAlgoCount = 0;
  if (requestedAlgoCount < 1 || !heuristicResultsArray)
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE,
                  "requestedAlgoCount is " + std::to_string(requestedAlgoCount) +
                      (heuristicResultsArray ? "" : " and heuristicResultsArray is null") +
                      "; room for at least one result is needed");
  const cublasLtMatmulPreferenceOpaque_t defaults{};
  if (preference && preference->magic != kPreferenceMagic)
    return refuse(kCall, CUBLAS_STATUS_INVALID_VALUE, "preference is not a live matmul preference");
  const cublasLtMatmulPreferenceOpaque_t& pref = preference ? *preference : defaults;
  Problem p;
  cublasStatus_t s = check_problem(kCall, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const int32_t types[4] = {Adesc->type, Bdesc->type, Cdesc->type, Ddesc->type};
  s = check_alignments(pref, types);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  fill_result(pref, &heuristicResultsArray[0]);
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}
