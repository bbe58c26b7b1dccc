// The argument checks every Communicator backend shares, run once by the
// public calls of comm/communicator.h before a backend hook: what makes a
// collective well-formed whatever moves it (element counts against the
// group size, matching dtypes, roots, peers and counts in range, a group's
// messages to itself paired). What only one backend refuses (a tensor on
// the other device, a dtype it cannot reduce, aliased buffers NCCL cannot
// take) stays in that backend. Each throws std::invalid_argument
// "<collective> on group <describe()>: <what is wrong>".
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace trainer {

class Communicator;
struct P2POp;

void check_all_reduce(const Communicator& c, const Tensor& t);
void check_reduce_scatter(const Communicator& c, const Tensor& out, const Tensor& in);
void check_all_gather(const Communicator& c, const Tensor& out, const Tensor& in);
void check_broadcast(const Communicator& c, const Tensor& t, int root);
void check_all_to_all(const Communicator& c, const Tensor& out, const Tensor& in);
void check_all_to_all_v(const Communicator& c, const Tensor& out, const std::vector<int64_t>& out_counts,
                        const Tensor& in, const std::vector<int64_t>& in_counts);
void check_send_recv(const Communicator& c, const std::vector<P2POp>& ops);

}  // namespace trainer
