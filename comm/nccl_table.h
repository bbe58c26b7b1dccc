// The CUDA module's NCCL: the table that libtrainer_cuda.so fills
// (comm/nccl_table_entry.cpp, built into the module) and comm/process_group.cpp
// fetches through core/cuda_module.h to make communicators on CUDA. The table
// is there in every module; without NCCL (TRAINER_HAVE_NCCL unset when the
// module was built) its communicator entries are null and `version` says
// "no NCCL".
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"
#include "core/cuda_table.h"

namespace trainer {

// Bump by hand when an entry changes meaning without changing its declaration.
inline constexpr int kNcclTableAbi = 1;
// The module's exported C function that returns this table.
inline constexpr const char* kNcclTableEntry = "trainer_cuda_nccl";

// (return type, name, (parameters)):
//   version      "NCCL 2.27.7" (ncclGetVersion), or "no NCCL"; `trainer devices`
//                prints it after the device runtime's description
//   nccl_world   NcclCommunicator::create_world (comm/nccl_communicator.h);
//   nccl_split   splitting an NCCL communicator; both null without NCCL
#define TRAINER_NCCL_TABLE_CALLS(X)                                                         \
  X(std::string, version, ())                                                               \
  X(std::unique_ptr<Communicator>, nccl_world,                                              \
    (Store & store, int rank, int world, double timeout_s, int generation))                 \
  X(std::unique_ptr<Communicator>, nccl_split,                                              \
    (Communicator & parent, int color, int key, std::string name, std::vector<int> members))

inline constexpr uint64_t kNcclTableSignature =
    cuda_table_hash("nccl;" TRAINER_NCCL_TABLE_CALLS(TRAINER_CUDA_TABLE_TEXT));

struct NcclTable : CudaTable {
  TRAINER_NCCL_TABLE_CALLS(TRAINER_CUDA_TABLE_POINTER)
};

inline constexpr CudaTableSpec kNcclTableSpec = {kNcclTableEntry, "NCCL", kNcclTableAbi, kNcclTableSignature,
                                                 sizeof(NcclTable)};

// The module's NCCL table, fetched and checked on the first call
// (thread-safe; later calls return the same answer). nullptr with the reason
// in *why, as core/cuda_module.h phrases it.
const NcclTable* nccl_table(std::string* why);

}  // namespace trainer
