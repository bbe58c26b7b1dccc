#include "model/units.h"

#include <stdexcept>
#include <string>

namespace trainer {

const char* grad_group_name(GradGroup g) { return g == GradGroup::DpCp ? "dp_cp" : "edp"; }

namespace {
struct UnitKey {
  UnitKind kind;
  int64_t layer;
  bool operator==(const UnitKey&) const = default;
};

// Which unit a parameter belongs to, from its name (docs/MODEL_MATH.md).
UnitKey unit_of(const ParamInfo& p, const ModelDims& d) {
  const std::string& name = p.spec.name;
  if (name.rfind("layers.", 0) == 0) {
    const int64_t local = std::stoll(name.substr(7)) - d.first_layer;
    return {p.expert() ? UnitKind::Experts : UnitKind::Layer, local};
  }
  if (!d.has_embedding || !(name.rfind("tok_embed.", 0) == 0 || name.rfind("pos_embed.", 0) == 0))
    return {UnitKind::Head, -1};  // the last stage's copy of a tied table is part of its head
  return {UnitKind::Embedding, -1};
}
}  // namespace

std::vector<UnitLayout> unit_layout(const ModelDims& d, const std::vector<ParamInfo>& params, int dense_shards,
                                    int expert_shards) {
  if (dense_shards < 1 || expert_shards < 1) throw std::invalid_argument("unit_layout: shards must be >= 1");
  std::vector<UnitLayout> units;
  size_t offset = 0;
  size_t i = 0;
  while (i < params.size()) {
    UnitLayout u;
    const UnitKey key = unit_of(params[i], d);
    u.kind = key.kind;
    u.layer = key.layer;
    u.group = key.kind == UnitKind::Experts ? GradGroup::Edp : GradGroup::DpCp;
    u.shards = u.group == GradGroup::Edp ? expert_shards : dense_shards;
    u.first = u.end = int(i);
    u.offset = offset;
    size_t bytes = 0;
    while (i < params.size() && unit_of(params[i], d) == key) {
      u.param_offset.push_back(bytes);
      bytes += arena_round(params[i].spec.bytes());
      ++i;
    }
    u.end = int(i);
    for (const UnitLayout& v : units)
      if (v.kind == u.kind && v.layer == u.layer)
        throw std::logic_error("unit_layout: parameter '" + params[size_t(u.first)].spec.name +
                               "' is out of unit order in parameter_list");
    const size_t quantum = size_t(u.shards) * kArenaAlign;
    u.bytes = (bytes + quantum - 1) / quantum * quantum;
    offset += u.bytes;
    units.push_back(std::move(u));
  }
  return units;
}

size_t units_total_bytes(const std::vector<UnitLayout>& units) {
  size_t s = 0;
  for (const auto& u : units) s += u.bytes;
  return s;
}

UnitIndex unit_index(const ModelDims& d, const std::vector<UnitLayout>& units) {
  UnitIndex x;
  x.layers.resize(size_t(d.L));
  for (size_t k = 0; k < units.size(); ++k) {
    const UnitLayout& u = units[k];
    switch (u.kind) {
      case UnitKind::Embedding: x.embedding = int(k); break;
      case UnitKind::Head: x.head = int(k); break;
      case UnitKind::Layer:
      case UnitKind::Experts:
        if (u.layer < 0 || u.layer >= d.L) throw std::logic_error("unit_index: layer unit out of range");
        x.layers[size_t(u.layer)].push_back(int(k));
        break;
    }
  }
  return x;
}

}  // namespace trainer
