// The emulated NCCL's point-to-point calls and groups (emu/cuda_shim/nccl.h).
// With one rank every send goes to rank 0 and every receive comes from it:
// NCCL allows that when both are in one ncclGroupStart/ncclGroupEnd, and
// pairs the n-th send with the n-th receive. So sends and receives wait in a
// per-thread group (groups are per thread in NCCL too) and ncclGroupEnd pairs
// and copies them, after checking every pair: nothing is copied if one is
// wrong. A send outside a group could never complete (its receive could not
// be posted while it blocks), so it is refused instead of hanging.
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "emu/nccl_state.h"

namespace trainer::emu::nccl {
namespace {

struct Transfer {
  ncclComm_t comm;
  const void* send;  // null for a receive
  void* recv;        // null for a send
  size_t bytes;
};

struct Group {
  int depth = 0;
  std::vector<Transfer> sends, recvs;
};

thread_local Group t_group;

ncclResult_t post(const char* call, const Transfer& t, size_t count, ncclDataType_t type, int peer) {
  if (!live(call, t.comm) || !known_type(call, type) || !known_peer(call, "peer", peer)) return ncclInvalidArgument;
  if (count == 0) return ncclSuccess;  // nothing to move, nothing to pair
  if (!t.send && !t.recv) return fail(call, ncclInvalidArgument, "the buffer is null with a nonzero count");
  if (t_group.depth == 0)
    return fail(call, ncclInvalidUsage,
                "a send to and a receive from this rank itself complete only together: issue both between "
                "ncclGroupStart and ncclGroupEnd");
  (t.send ? t_group.sends : t_group.recvs).push_back(t);
  return ncclSuccess;
}

constexpr size_t kNone = SIZE_MAX;

// The n-th send and the n-th receive of a communicator form a pair: the
// index of send `i`'s receive, or kNone.
size_t partner(const Group& g, size_t i) {
  size_t n = 0;  // sends before i on the same communicator
  for (size_t k = 0; k < i; ++k) n += g.sends[k].comm == g.sends[i].comm;
  for (size_t j = 0; j < g.recvs.size(); ++j)
    if (g.recvs[j].comm == g.sends[i].comm && n-- == 0) return j;
  return kNone;
}

bool overlap(const void* a, void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x != y && x < y + bytes && y < x + bytes;
}

// Every send has its receive of the same size, and every receive its send.
ncclResult_t check_pairs(const Group& g, std::vector<size_t>* recv_of) {
  const char* call = "ncclGroupEnd";
  if (g.sends.size() != g.recvs.size())
    return fail(call, ncclInvalidUsage,
                "the group has " + std::to_string(g.sends.size()) + " sends to rank 0 but " +
                    std::to_string(g.recvs.size()) + " receives from it; each send to this rank itself needs its receive");
  for (size_t i = 0; i < g.sends.size(); ++i) {
    const size_t j = partner(g, i);
    if (j == kNone)
      return fail(call, ncclInvalidUsage, "send " + std::to_string(i) + " has no receive on its communicator");
    const Transfer &s = g.sends[i], &r = g.recvs[j];
    if (s.bytes != r.bytes)
      return fail(call, ncclInvalidUsage,
                  "send " + std::to_string(i) + " moves " + std::to_string(s.bytes) + " bytes but its receive expects " +
                      std::to_string(r.bytes));
    if (overlap(s.send, r.recv, s.bytes))
      return fail(call, ncclInvalidArgument, "send " + std::to_string(i) + "'s buffer overlaps its receive buffer");
    recv_of->push_back(j);
  }
  return ncclSuccess;
}

ncclResult_t finish_group() {
  Group g = std::move(t_group);
  t_group = Group{};
  std::vector<size_t> recv_of;
  const ncclResult_t r = check_pairs(g, &recv_of);
  if (r != ncclSuccess) return r;
  for (size_t i = 0; i < g.sends.size(); ++i) {
    const Transfer &s = g.sends[i], &r = g.recvs[recv_of[i]];
    if (s.send != r.recv) std::memcpy(r.recv, s.send, s.bytes);
  }
  return ncclSuccess;
}

}  // namespace
}  // namespace trainer::emu::nccl

using namespace trainer::emu::nccl;

extern "C" {

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t /*stream*/) {
  return post("ncclSend", Transfer{comm, sendbuff, nullptr, count * type_bytes(datatype)}, count, datatype, peer);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t /*stream*/) {
  return post("ncclRecv", Transfer{comm, nullptr, recvbuff, count * type_bytes(datatype)}, count, datatype, peer);
}

ncclResult_t ncclGroupStart(void) {
  ++t_group.depth;
  return ncclSuccess;
}

// Groups nest; the outermost end runs the group.
ncclResult_t ncclGroupEnd(void) {
  if (t_group.depth == 0) return fail("ncclGroupEnd", ncclInvalidUsage, "no ncclGroupStart is open on this thread");
  if (--t_group.depth > 0) return ncclSuccess;
  return finish_group();
}

}  // extern "C"
