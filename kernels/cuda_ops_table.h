// The CUDA module's ops: one function pointer per op of kernels/op_list.h,
// the kernels/cuda functions, which the router (kernels/ops.cpp) calls after
// the shared checks. The module fills it (kernels/cuda/ops_table_entry.cpp);
// the router fetches it through core/cuda_module.h the first time a CUDA
// tensor reaches an op. Its signature hashes the op list's text, so adding or
// changing an op refuses a stale module by itself.
#pragma once

#include <string>

#include "core/cuda_table.h"
#include "kernels/ops.h"

namespace trainer {

// Bump by hand when an op changes meaning without changing its declaration.
inline constexpr int kCudaOpsAbi = 1;
// The module's exported C function that returns this table.
inline constexpr const char* kCudaOpsEntry = "trainer_cuda_ops";

namespace cuda_ops_table_detail {
#define TRAINER_OP(route, ret, name, params, args) TRAINER_CUDA_TABLE_TEXT(ret, name, params)
inline constexpr const char kSignatureText[] = "ops;"
#include "kernels/op_list.h"
    ;
#undef TRAINER_OP
}  // namespace cuda_ops_table_detail

inline constexpr uint64_t kCudaOpsSignature = cuda_table_hash(cuda_ops_table_detail::kSignatureText);

struct CudaOpsTable : CudaTable {
  using AdamWStep = ops::AdamWStep;
  using Rope = ops::Rope;
#define TRAINER_OP(route, ret, name, params, args) TRAINER_CUDA_TABLE_POINTER(ret, name, params)
#include "kernels/op_list.h"
#undef TRAINER_OP
};

inline constexpr CudaTableSpec kCudaOpsSpec = {kCudaOpsEntry, "ops", kCudaOpsAbi, kCudaOpsSignature,
                                               sizeof(CudaOpsTable)};

// The module's ops, fetched and checked on the first call (thread-safe;
// later calls return the same answer). nullptr with the reason in *why, as
// core/cuda_module.h phrases it.
const CudaOpsTable* cuda_ops_table(std::string* why);

}  // namespace trainer
