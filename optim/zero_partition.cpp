#include "optim/zero_partition.h"

#include <algorithm>

namespace trainer {

int64_t shard_elems(const UnitLayout& u, size_t elem_bytes, int shards) {
  return int64_t(u.shard_bytes(shards) / elem_bytes);
}

std::vector<int64_t> shard_offsets(const std::vector<UnitLayout>& units, size_t elem_bytes, int shards) {
  std::vector<int64_t> off(units.size() + 1, 0);
  for (size_t u = 0; u < units.size(); ++u) off[u + 1] = off[u] + shard_elems(units[u], elem_bytes, shards);
  return off;
}

std::vector<ZeroPiece> shard_pieces(const std::vector<UnitLayout>& units, const std::vector<ParamInfo>& params,
                                    size_t elem_bytes, int shards, int rank) {
  std::vector<ZeroPiece> out;
  for (size_t u = 0; u < units.size(); ++u) {
    const UnitLayout& U = units[u];
    const int64_t S = shard_elems(U, elem_bytes, shards);
    const int64_t lo = int64_t(rank) * S, hi = lo + S;
    for (int p = U.first; p < U.end; ++p) {
      const int64_t start = int64_t(U.param_offset[size_t(p - U.first)] / elem_bytes);
      const int64_t n = params[size_t(p)].spec.numel();
      const int64_t a = std::max(lo, start), b = std::min(hi, start + n);
      if (a < b) out.push_back({p, int(u), a - start, b - a, a});
    }
  }
  return out;
}

}  // namespace trainer
