// What the emulated NCCL's communicator holds (emu/cuda_shim/nccl.h declares
// it opaque) and the checks its calls share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "emu/cuda_shim/nccl.h"

struct ncclComm {
  uint64_t magic;
  int nranks;  // always 1: more are refused at init
  int rank;
};

namespace trainer::emu::nccl {

inline constexpr uint64_t kCommMagic = 0x6e63636c436f6d6dull;  // "ncclComm"

// Records "CALL: WHY" as this thread's last error (ncclGetLastError) and
// returns `result`.
ncclResult_t fail(const char* call, ncclResult_t result, const std::string& why);

// A communicator made by ncclCommInitRank or ncclCommSplit and not yet
// destroyed or aborted; else records why and returns false.
bool live(const char* call, ncclComm_t comm);

// Bytes per element, 0 for a value that is no ncclDataType_t.
size_t type_bytes(ncclDataType_t type);

// A known data type; else records why and returns false.
bool known_type(const char* call, ncclDataType_t type);

// Rank `peer` (a root or a send/receive partner) of a one-rank communicator:
// only 0 is one.
bool known_peer(const char* call, const char* what, int peer);

}  // namespace trainer::emu::nccl
