// ZeroOptimizer::replica_pieces: which of a rank's state its data-parallel
// group must hold identically (optim/zero.h, train/replica_check.h).
#include <algorithm>

#include "optim/zero.h"
#include "optim/zero_partition.h"

namespace trainer {

std::vector<ReplicaPiece> ZeroOptimizer::replica_pieces() const {
  std::vector<ReplicaPiece> out;
  if (stage_ >= 3) return out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = units_[u];
    const Communicator& g = comm(int(u));
    if (ul.bytes == 0 || g.size() == 1) continue;
    // Stages 1-2: a piece ends at a shard boundary, so that each has one
    // owner, whose update the all-gather copied to the others.
    const int64_t shard = stage_ == 0 ? 0 : shard_elems(ul, elem_);
    for (int p = ul.first; p < ul.end; ++p) {
      const Tensor& w = m_.param_tensors[size_t(p)];
      const int64_t n = w.numel(), at = int64_t(ul.param_offset[size_t(p - ul.first)] / elem_);
      for (int64_t b = 0; b < n;) {
        int64_t len = n - b;
        int owner = -1;
        if (shard > 0) {
          const int64_t s = (at + b) / shard;
          len = std::min(len, (s + 1) * shard - (at + b));
          owner = g.members()[size_t(s)];
        }
        out.push_back({"weights", p, b, flat(w.data, m_.dims.act, b, len), &g, owner});
        b += len;
      }
    }
  }
  if (stage_ > 0) return out;
  for (const ZeroPiece& z : opt_pieces_) {
    const Communicator& g = comm(z.unit);
    if (g.size() == 1) continue;
    out.push_back({"optim m", z.param, z.begin, moment_m(z), &g, -1});
    out.push_back({"optim v", z.param, z.begin, moment_v(z), &g, -1});
    if (mixed_ || offload_) out.push_back({"fp32 master", z.param, z.begin, fp32_weight(z), &g, -1});
  }
  return out;
}

}  // namespace trainer
