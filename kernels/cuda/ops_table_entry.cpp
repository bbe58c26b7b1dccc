// The module's ops table (kernels/cuda_ops_table.h): every op of
// kernels/op_list.h, the kernels/cuda function of the same name;
// kernels/cuda_ops_table.cpp fetches it through the loader.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda_ops_table.h"

namespace trainer::cuda {
namespace {

CudaOpsTable make_ops_table() {
  CudaOpsTable t;
  t.abi_version = kCudaOpsAbi;
  t.signature = kCudaOpsSignature;
  t.table_bytes = sizeof(CudaOpsTable);
#define TRAINER_OP(route, ret, name, params, args) t.name = &cuda::name;
#include "kernels/op_list.h"
#undef TRAINER_OP
  return t;
}

}  // namespace
}  // namespace trainer::cuda

extern "C" __attribute__((visibility("default"))) const trainer::CudaTable* trainer_cuda_ops() {
  static const trainer::CudaOpsTable table = trainer::cuda::make_ops_table();
  return &table;
}
