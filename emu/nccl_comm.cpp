// The emulated NCCL's communicators (emu/cuda_shim/nccl.h): one rank each.
// A wish for more ranks is refused where it is made, ncclCommInitRank, with
// the way out (parallel.backend: host) on stderr, instead of a hang waiting
// for peers that the emulated device cannot have.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "emu/nccl_state.h"

namespace trainer::emu::nccl {
namespace {

// NCCL keeps the last error per thread; so does the emulator.
thread_local std::string t_last_error;

constexpr unsigned kConfigMagic = 0xcafebeef;  // NCCL_CONFIG_INITIALIZER's

// NCCL refuses a config that NCCL_CONFIG_INITIALIZER did not start.
bool config_ok(const char* call, const ncclConfig_t* config) {
  if (!config || config->magic == kConfigMagic) return true;
  fail(call, ncclInvalidArgument, "config was not initialized with NCCL_CONFIG_INITIALIZER");
  return false;
}

ncclResult_t init(const char* call, ncclComm_t* comm, int nranks, int rank, const ncclConfig_t* config) {
  if (!comm) return fail(call, ncclInvalidArgument, "comm (the pointer to the new communicator) is null");
  *comm = nullptr;
  if (nranks > 1) {
    const std::string why = "the emulated CUDA device runs NCCL for one rank only; use parallel.backend: host for "
                            "more ranks (asked for rank " + std::to_string(rank) + " of " + std::to_string(nranks) + ")";
    std::fprintf(stderr, "%s: %s\n", call, why.c_str());
    return fail(call, ncclInvalidUsage, why);
  }
  if (nranks < 1 || rank != 0)
    return fail(call, ncclInvalidArgument,
                "rank " + std::to_string(rank) + " of " + std::to_string(nranks) + " ranks is no rank of a communicator");
  if (!config_ok(call, config)) return ncclInvalidArgument;
  *comm = new (std::nothrow) ncclComm{kCommMagic, 1, 0};
  return *comm ? ncclSuccess : fail(call, ncclSystemError, "no memory for a communicator");
}

// Destroy and abort both free the communicator: with one rank nothing is in
// flight (every call completed before it returned).
ncclResult_t release(const char* call, ncclComm_t comm) {
  if (!comm) return fail(call, ncclInvalidArgument, "comm is null");
  if (!live(call, comm)) return ncclInvalidArgument;
  comm->magic = 0;  // a later use of the stale pointer is then likely caught
  delete comm;
  return ncclSuccess;
}

}  // namespace

ncclResult_t fail(const char* call, ncclResult_t result, const std::string& why) {
  t_last_error = std::string(call) + ": " + why;
  return result;
}

bool live(const char* call, ncclComm_t comm) {
  if (comm && comm->magic == kCommMagic) return true;
  fail(call, ncclInvalidArgument,
       comm ? "comm is not a live communicator (destroyed or aborted?)" : "comm is null");
  return false;
}

size_t type_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
  }
}

bool known_type(const char* call, ncclDataType_t type) {
  if (type_bytes(type) > 0) return true;
  fail(call, ncclInvalidArgument, "datatype " + std::to_string(int(type)) + " is no ncclDataType_t");
  return false;
}

bool known_peer(const char* call, const char* what, int peer) {
  if (peer == 0) return true;
  fail(call, ncclInvalidArgument,
       std::string(what) + " " + std::to_string(peer) + " is no rank of this one-rank communicator (only 0 is)");
  return false;
}

}  // namespace trainer::emu::nccl

using namespace trainer::emu::nccl;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail("ncclGetVersion", ncclInvalidArgument, "version is null");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// The id carries nothing a peer could use (there are none); it only has to be
// NCCL_UNIQUE_ID_BYTES that the world's rank 0 publishes through the store.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail("ncclGetUniqueId", ncclInvalidArgument, "uniqueId is null");
  static std::atomic<unsigned long long> counter{0};
  std::memset(uniqueId->internal, 0, NCCL_UNIQUE_ID_BYTES);
  std::snprintf(uniqueId->internal, NCCL_UNIQUE_ID_BYTES, "trainer-emu-nccl %llu", counter.fetch_add(1) + 1);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId /*commId*/, int rank) {
  return init("ncclCommInitRank", comm, nranks, rank, nullptr);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId /*commId*/, int rank,
                                    ncclConfig_t* config) {
  return init("ncclCommInitRankConfig", comm, nranks, rank, config);
}

// The parent's only rank lands in a one-rank group of its color, at rank 0
// whatever its key.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int /*key*/, ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* call = "ncclCommSplit";
  if (!newcomm) return fail(call, ncclInvalidArgument, "newcomm is null");
  *newcomm = nullptr;
  if (!live(call, comm) || !config_ok(call, config)) return ncclInvalidArgument;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  if (color < 0)
    return fail(call, ncclInvalidArgument,
                "color " + std::to_string(color) + " is negative and not NCCL_SPLIT_NOCOLOR");
  return init(call, newcomm, 1, 0, config);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release("ncclCommDestroy", comm); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { return release("ncclCommAbort", comm); }

// Errors are returned by the calls themselves; nothing fails later.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return fail("ncclCommGetAsyncError", ncclInvalidArgument, "asyncError is null");
  if (!live("ncclCommGetAsyncError", comm)) return ncclInvalidArgument;
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!count) return fail("ncclCommCount", ncclInvalidArgument, "count is null");
  if (!live("ncclCommCount", comm)) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!rank) return fail("ncclCommUserRank", ncclInvalidArgument, "rank is null");
  if (!live("ncclCommUserRank", comm)) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument (ncclGetLastError says which)";
    case ncclInvalidUsage: return "invalid usage (ncclGetLastError says why)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t /*comm*/) { return t_last_error.c_str(); }

}  // extern "C"
