// Which elements of which parameters one rank owns under ZeRO, as 1-D
// pieces: rank r of a unit's group owns shard r of that unit
// (model/units.h), and a piece is where that shard meets one parameter. Pure
// arithmetic on the unit layout, shared by the optimizer (what it updates),
// the checkpoint (what it writes) and the memory plan.
#pragma once

#include <cstdint>
#include <vector>

#include "model/units.h"

namespace trainer {

struct ZeroPiece {
  int param = 0;           // index in the parameter list
  int unit = 0;
  int64_t begin = 0;       // first element within the parameter's local slice (row-major)
  int64_t count = 0;
  int64_t unit_elem = 0;   // first element within the unit's padded range
};

// The pieces of shard unit_rank[u] of every unit u, in parameter order;
// padding is never part of a piece.
std::vector<ZeroPiece> shard_pieces(const std::vector<UnitLayout>& units, const std::vector<ParamInfo>& params,
                                    size_t elem_bytes, const std::vector<int>& unit_rank);
// Every element of every parameter (no sharding), in parameter order.
std::vector<ZeroPiece> all_pieces(const std::vector<UnitLayout>& units, const std::vector<ParamInfo>& params,
                                  size_t elem_bytes);

// Elements of one shard of unit u, and where each unit's shard starts in the
// concatenation of a rank's shards (the layout of ZeRO-2/3 shard arenas and
// of the optimizer state at stages 1-3).
int64_t shard_elems(const UnitLayout& u, size_t elem_bytes);
std::vector<int64_t> shard_offsets(const std::vector<UnitLayout>& units, size_t elem_bytes);

}  // namespace trainer
