// The emulated NCCL's collectives for one rank (emu/cuda_shim/nccl.h). With
// one rank, all-reduce, reduce-scatter, all-gather and broadcast all leave
// the receive buffer equal to the send buffer (a reduction over one input is
// that input, the average included), so each is one copy, or nothing in
// place. The arguments are checked as NCCL checks them, so a call that would
// fail on GPUs fails here too.
#include <cstdint>
#include <cstring>
#include <string>

#include "emu/nccl_state.h"

namespace trainer::emu::nccl {
namespace {

bool known_op(const char* call, ncclRedOp_t op) {
  if (op >= ncclSum && op < ncclNumOps) return true;
  fail(call, ncclInvalidArgument,
       "op " + std::to_string(int(op)) + " is not ncclSum, ncclProd, ncclMax, ncclMin or ncclAvg (custom "
                                         "reduction operators are not emulated)");
  return false;
}

// In place means the same address for rank 0 of one rank (NCCL's in-place
// condition, recvbuff + rank * count, reduces to that); any other overlap is
// a race on GPUs and an error here.
ncclResult_t check_buffers(const char* call, const void* send, void* recv, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  if (!send || !recv)
    return fail(call, ncclInvalidArgument,
                std::string(send ? "recvbuff" : "sendbuff") + " is null with " + std::to_string(bytes) +
                    " bytes to move");
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (s != r && s < r + bytes && r < s + bytes)
    return fail(call, ncclInvalidArgument, "sendbuff and recvbuff overlap without being the same buffer (in place)");
  return ncclSuccess;
}

ncclResult_t copy(const char* call, const void* send, void* recv, size_t count, ncclDataType_t type,
                  ncclComm_t comm) {
  if (!live(call, comm) || !known_type(call, type)) return ncclInvalidArgument;
  const size_t bytes = count * type_bytes(type);
  const ncclResult_t r = check_buffers(call, send, recv, bytes);
  if (r == ncclSuccess && bytes > 0 && send != recv) std::memcpy(recv, send, bytes);
  return r;
}

}  // namespace
}  // namespace trainer::emu::nccl

using namespace trainer::emu::nccl;

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t /*stream*/) {
  if (!known_op("ncclAllReduce", op)) return ncclInvalidArgument;
  return copy("ncclAllReduce", sendbuff, recvbuff, count, datatype, comm);
}

// sendbuff holds nranks * recvcount elements: with one rank, recvcount.
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t /*stream*/) {
  if (!known_op("ncclReduceScatter", op)) return ncclInvalidArgument;
  return copy("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, comm);
}

// recvbuff holds nranks * sendcount elements: with one rank, sendcount.
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t /*stream*/) {
  return copy("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, comm);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t /*stream*/) {
  if (!known_peer("ncclBroadcast", "root", root)) return ncclInvalidArgument;
  return copy("ncclBroadcast", sendbuff, recvbuff, count, datatype, comm);
}

}  // extern "C"
