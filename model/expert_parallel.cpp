#include "model/expert_parallel.h"

#include <numeric>
#include <stdexcept>
#include <string>

#include "core/device_memory.h"

namespace trainer {

void ep_plan(const ModelDims& d, Communicator& ep, LayerActs& a) {
  const int P = ep.size(), me = ep.rank();
  const int64_t E = d.E, El = d.experts_here();
  if (int64_t(P) * El != E)
    throw std::logic_error("ep_plan: " + ep.describe() + " has " + std::to_string(P) + " ranks for " +
                           std::to_string(E) + " experts, " + std::to_string(El) + " here");
  ep.all_gather(a.ep_gather, a.offsets);
  std::vector<int32_t> all(size_t(P * (E + 1)));
  read_to_host(a.ep_gather, all.data());
  auto off = [&](int s, int64_t e) { return int64_t(all[size_t(s * (E + 1) + e)]); };
  a.ep_send.assign(size_t(P), 0);
  a.ep_recv.assign(size_t(P), 0);
  std::vector<int32_t> seg(size_t(P * (El + 1)));
  for (int q = 0; q < P; ++q) {
    a.ep_send[size_t(q)] = off(me, (q + 1) * El) - off(me, q * El);
    a.ep_recv[size_t(q)] = off(q, (me + 1) * El) - off(q, me * El);
    for (int64_t e = 0; e <= El; ++e) seg[size_t(q * (El + 1) + e)] = int32_t(off(q, me * El + e) - off(q, me * El));
  }
  const int64_t got = std::accumulate(a.ep_recv.begin(), a.ep_recv.end(), int64_t(0));
  if (got > a.xe.dim(0))
    throw std::runtime_error("expert parallelism on " + ep.describe() + ": this rank's experts receive " +
                             std::to_string(got) + " rows, room is reserved for " + std::to_string(a.xe.dim(0)));
  write_from_host(a.ep_offsets, seg.data());
}

std::vector<ExpertSegment> expert_segments(const ModelDims& d, const LayerActs& a) {
  if (d.ep <= 1) return {{0, a.xp.dim(0), a.offsets}};
  std::vector<ExpertSegment> out;
  const int64_t El = d.experts_here();
  int64_t at = 0;
  for (size_t s = 0; s < a.ep_recv.size(); ++s) {
    const int64_t n = a.ep_recv[s];
    if (n > 0) out.push_back({at, n, a.ep_offsets.slice0(int64_t(s), int64_t(s) + 1).view({El + 1})});
    at += n;
  }
  return out;
}

int64_t expert_rows_used(const ModelDims& d, const LayerActs& a) {
  if (d.ep <= 1) return a.xp.dim(0);
  return std::accumulate(a.ep_recv.begin(), a.ep_recv.end(), int64_t(0));
}

void ep_exchange(Communicator& ep, Tensor out, const std::vector<int64_t>& out_rows, Tensor in,
                 const std::vector<int64_t>& in_rows) {
  const int64_t w_out = out.dim(0) > 0 ? out.numel() / out.dim(0) : 0, w_in = in.dim(0) > 0 ? in.numel() / in.dim(0) : 0;
  std::vector<int64_t> oc(out_rows.size()), ic(in_rows.size());
  for (size_t q = 0; q < oc.size(); ++q) oc[q] = out_rows[q] * w_out;
  for (size_t q = 0; q < ic.size(); ++q) ic[q] = in_rows[q] * w_in;
  ep.all_to_all_v(out.view({out.numel()}), oc, in.view({in.numel()}), ic);
}

}  // namespace trainer
