#include "optim/zero_partition.h"

#include <algorithm>
#include <stdexcept>

namespace trainer {

int64_t shard_elems(const UnitLayout& u, size_t elem_bytes) { return int64_t(u.shard_bytes() / elem_bytes); }

std::vector<int64_t> shard_offsets(const std::vector<UnitLayout>& units, size_t elem_bytes) {
  std::vector<int64_t> off(units.size() + 1, 0);
  for (size_t u = 0; u < units.size(); ++u) off[u + 1] = off[u] + shard_elems(units[u], elem_bytes);
  return off;
}

namespace {
// Where [lo, hi) of unit u's padded range meets its parameters.
void pieces_of(const std::vector<UnitLayout>& units, const std::vector<ParamInfo>& params, size_t elem_bytes,
               size_t u, int64_t lo, int64_t hi, std::vector<ZeroPiece>& out) {
  const UnitLayout& U = units[u];
  for (int p = U.first; p < U.end; ++p) {
    const int64_t start = int64_t(U.param_offset[size_t(p - U.first)] / elem_bytes);
    const int64_t n = params[size_t(p)].spec.numel();
    const int64_t a = std::max(lo, start), b = std::min(hi, start + n);
    if (a < b) out.push_back({p, int(u), a - start, b - a, a});
  }
}
}  // namespace

std::vector<ZeroPiece> shard_pieces(const std::vector<UnitLayout>& units, const std::vector<ParamInfo>& params,
                                    size_t elem_bytes, const std::vector<int>& unit_rank) {
  if (unit_rank.size() != units.size()) throw std::logic_error("shard_pieces: one rank per unit");
  std::vector<ZeroPiece> out;
  for (size_t u = 0; u < units.size(); ++u) {
    if (unit_rank[u] < 0 || unit_rank[u] >= units[u].shards) throw std::logic_error("shard_pieces: rank out of range");
    const int64_t S = shard_elems(units[u], elem_bytes);
    pieces_of(units, params, elem_bytes, u, int64_t(unit_rank[u]) * S, int64_t(unit_rank[u] + 1) * S, out);
  }
  return out;
}

std::vector<ZeroPiece> all_pieces(const std::vector<UnitLayout>& units, const std::vector<ParamInfo>& params,
                                  size_t elem_bytes) {
  std::vector<ZeroPiece> out;
  for (size_t u = 0; u < units.size(); ++u)
    pieces_of(units, params, elem_bytes, u, 0, int64_t(units[u].bytes / elem_bytes), out);
  return out;
}

}  // namespace trainer
