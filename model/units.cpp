#include "model/units.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace trainer {

namespace {
// Which unit a parameter belongs to, from its name (docs/MODEL_MATH.md).
int unit_of(const std::string& name, const ModelDims& d) {
  if (name.rfind("layers.", 0) == 0) return layer_unit(std::stoll(name.substr(7)));
  if (name.rfind("tok_embed.", 0) == 0 || name.rfind("pos_embed.", 0) == 0) return embedding_unit();
  return head_unit(d);
}
}  // namespace

std::vector<UnitLayout> unit_layout(const ModelDims& d, const std::vector<ParamInfo>& params, int shards) {
  if (shards < 1) throw std::invalid_argument("unit_layout: shards must be >= 1");
  std::vector<UnitLayout> units(size_t(head_unit(d)) + 1);
  const size_t quantum = size_t(shards) * kArenaAlign;
  size_t offset = 0;
  int prev = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    UnitLayout& U = units[u];
    U.first = U.end = prev;
    U.offset = offset;
    size_t bytes = 0;
    while (size_t(U.end) < params.size() && unit_of(params[size_t(U.end)].spec.name, d) == int(u)) {
      U.param_offset.push_back(bytes);
      bytes += arena_round(params[size_t(U.end)].spec.bytes());
      ++U.end;
    }
    U.bytes = (bytes + quantum - 1) / quantum * quantum;
    offset += U.bytes;
    prev = U.end;
  }
  if (size_t(prev) != params.size())
    throw std::logic_error("unit_layout: parameter '" + params[size_t(prev)].spec.name +
                           "' is out of unit order in parameter_list");
  return units;
}

size_t units_total_bytes(const std::vector<UnitLayout>& units) {
  size_t s = 0;
  for (const auto& u : units) s += u.bytes;
  return s;
}

size_t units_max_bytes(const std::vector<UnitLayout>& units) {
  size_t s = 0;
  for (const auto& u : units) s = std::max(s, u.bytes);
  return s;
}

}  // namespace trainer
