// A stand-in for libtrainer_cuda.so that exports the three tables of the real
// module (core/cuda_backend.h, kernels/cuda_ops_table.h, comm/nccl_table.h)
// with no CUDA behind them, one of them made stale on request, so that
// tests/test_cuda_module.cpp can watch the trainer refuse a module built from
// other sources, table by table. STAND_IN_STALE_TABLE picks the table:
//   runtime | ops | nccl   that table's signature differs from the trainer's
//   old-runtime            the device runtime as the one-table module had it
//                          (ABI 1, a larger table)
//   no-ops                 the ops entry returns no table
// Unset, every table matches.
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/nccl_table.h"
#include "core/cuda_backend.h"
#include "kernels/cuda_ops_table.h"

namespace {

bool stale(const char* table) {
  const char* v = std::getenv("STAND_IN_STALE_TABLE");
  return v && std::strcmp(v, table) == 0;
}

template <typename T>
void fill_header(T& t, int abi, uint64_t signature, const char* name) {
  t.abi_version = abi;
  t.signature = stale(name) ? signature ^ 0x5a5a5a5a5a5a5a5aull : signature;
  t.table_bytes = sizeof(T);
}

std::string describe() { return "stand-in runtime"; }
int device_count(std::string* why) {
  if (why) *why = "a stand-in module has no devices";
  return -1;
}
std::string nccl_version() { return "stand-in NCCL"; }

}  // namespace

extern "C" __attribute__((visibility("default"))) const trainer::CudaTable* trainer_cuda_backend() {
  static trainer::CudaBackend t;
  fill_header(t, trainer::kCudaBackendAbi, trainer::kCudaBackendSignature, "runtime");
  if (stale("old-runtime")) {
    t.abi_version = 1;
    t.table_bytes = sizeof(trainer::CudaBackend) + sizeof(trainer::CudaOpsTable);
  }
  t.describe = &describe;
  t.device_count = &device_count;
  return &t;
}

extern "C" __attribute__((visibility("default"))) const trainer::CudaTable* trainer_cuda_ops() {
  if (stale("no-ops")) return nullptr;
  static trainer::CudaOpsTable t;
  fill_header(t, trainer::kCudaOpsAbi, trainer::kCudaOpsSignature, "ops");
  return &t;
}

extern "C" __attribute__((visibility("default"))) const trainer::CudaTable* trainer_cuda_nccl() {
  static trainer::NcclTable t;
  fill_header(t, trainer::kNcclTableAbi, trainer::kNcclTableSignature, "nccl");
  t.version = &nccl_version;
  return &t;
}
