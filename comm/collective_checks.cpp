#include "comm/collective_checks.h"

#include <stdexcept>
#include <string>

#include "comm/communicator.h"

namespace trainer {

namespace {

[[noreturn]] void bad(const Communicator& c, const char* op, const std::string& why) {
  throw std::invalid_argument(std::string(op) + " on group " + c.describe() + ": " + why);
}

void need_data(const Communicator& c, const char* op, const char* what, const Tensor& t) {
  if (t.empty() && t.numel() > 0) bad(c, op, std::string(what) + " has no data");
}

void same_dtype(const Communicator& c, const char* op, const Tensor& out, const Tensor& in) {
  if (out.dtype != in.dtype) bad(c, op, std::string("out is ") + dtype_name(out.dtype) + ", in is " + dtype_name(in.dtype));
}

void need_pair(const Communicator& c, const char* op, const Tensor& out, const Tensor& in) {
  need_data(c, op, "out", out);
  need_data(c, op, "in", in);
  same_dtype(c, op, out, in);
}

std::string group_ranks(const Communicator& c) { return "(0.." + std::to_string(c.size() - 1) + ")"; }

}  // namespace

void check_all_reduce(const Communicator& c, const Tensor& t) { need_data(c, "all_reduce", "the tensor", t); }

void check_reduce_scatter(const Communicator& c, const Tensor& out, const Tensor& in) {
  const char* op = "reduce_scatter";
  need_pair(c, op, out, in);
  if (out.numel() * c.size() != in.numel())
    bad(c, op, "in has " + std::to_string(in.numel()) + " elements, out " + std::to_string(out.numel()) +
                   "; in must be out x " + std::to_string(c.size()));
}

void check_all_gather(const Communicator& c, const Tensor& out, const Tensor& in) {
  const char* op = "all_gather";
  need_pair(c, op, out, in);
  if (out.numel() != in.numel() * c.size())
    bad(c, op, "out has " + std::to_string(out.numel()) + " elements, in " + std::to_string(in.numel()) +
                   "; out must be in x " + std::to_string(c.size()));
}

void check_broadcast(const Communicator& c, const Tensor& t, int root) {
  need_data(c, "broadcast", "the tensor", t);
  if (root < 0 || root >= c.size())
    bad(c, "broadcast", "root " + std::to_string(root) + " is not a group rank " + group_ranks(c));
}

void check_all_to_all(const Communicator& c, const Tensor& out, const Tensor& in) {
  const char* op = "all_to_all";
  need_pair(c, op, out, in);
  if (out.numel() != in.numel() || in.numel() % c.size() != 0)
    bad(c, op, "in has " + std::to_string(in.numel()) + " elements, out " + std::to_string(out.numel()) +
                   "; both must be equal and divisible by " + std::to_string(c.size()));
}

void check_all_to_all_v(const Communicator& c, const Tensor& out, const std::vector<int64_t>& out_counts,
                        const Tensor& in, const std::vector<int64_t>& in_counts) {
  const char* op = "all_to_all_v";
  need_pair(c, op, out, in);
  const int n = c.size();
  if (int(out_counts.size()) != n || int(in_counts.size()) != n)
    bad(c, op, "needs one count per member (" + std::to_string(n) + "), got " + std::to_string(in_counts.size()) +
                   " in and " + std::to_string(out_counts.size()) + " out");
  int64_t in_total = 0, out_total = 0;
  for (int p = 0; p < n; ++p) {
    if (in_counts[size_t(p)] < 0 || out_counts[size_t(p)] < 0)
      bad(c, op, "negative count for group rank " + std::to_string(p));
    in_total += in_counts[size_t(p)];
    out_total += out_counts[size_t(p)];
  }
  if (in_total > in.numel() || out_total > out.numel())
    bad(c, op, "counts add up to " + std::to_string(in_total) + " in / " + std::to_string(out_total) +
                   " out, but the tensors hold " + std::to_string(in.numel()) + " / " + std::to_string(out.numel()));
  // What a rank sends itself it receives from itself.
  const size_t me = size_t(c.rank());
  if (in_counts[me] != out_counts[me])
    bad(c, op, "group rank " + std::to_string(me) + " sends itself " + std::to_string(in_counts[me]) +
                   " but receives " + std::to_string(out_counts[me]));
}

void check_send_recv(const Communicator& c, const std::vector<P2POp>& ops) {
  const char* op = "batch_send_recv";
  std::vector<const P2POp*> self_sends, self_recvs;
  for (const P2POp& p : ops) {
    need_data(c, op, p.send ? "a send tensor" : "a receive tensor", p.tensor);
    if (p.peer < 0 || p.peer >= c.size())
      bad(c, op, "peer " + std::to_string(p.peer) + " is not a group rank " + group_ranks(c));
    if (p.peer == c.rank() && p.tensor.nbytes() > 0) (p.send ? self_sends : self_recvs).push_back(&p);
  }
  // Messages to this rank itself: the k-th send meets the k-th receive.
  if (self_sends.size() != self_recvs.size())
    bad(c, op, std::to_string(self_sends.size()) + " sends to this rank itself but " +
                   std::to_string(self_recvs.size()) + " receives");
  for (size_t i = 0; i < self_sends.size(); ++i)
    if (self_sends[i]->tensor.nbytes() != self_recvs[i]->tensor.nbytes())
      bad(c, op, "a send to itself of " + std::to_string(self_sends[i]->tensor.nbytes()) +
                     " bytes meets a receive of " + std::to_string(self_recvs[i]->tensor.nbytes()));
}

}  // namespace trainer
