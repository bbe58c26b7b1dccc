#include "optim/zero_traffic.h"

#include <algorithm>
#include <vector>

#include "optim/zero.h"

namespace trainer {

double ZeroGroupTraffic::wire_bytes() const {
  if (size <= 1) return 0;
  const double f = double(size - 1) / double(size);
  return 2 * f * double(all_reduce) + f * double(reduce_scatter + all_gather);
}

namespace {

// The stage-3 weight pool of ZeroOptimizer, replayed without tensors: the
// same slot sizes, the same choice of slot (free and smallest, else least
// recently used, never a pinned one), the same prefetch, so the same
// all-gathers. Keep in step with ZeroOptimizer::take_slot, make_resident,
// weights_resident and prefetch_weights (the e2e test of the plan holds a
// real run's counts to this).
class WeightPoolReplay {
 public:
  WeightPoolReplay(const ShardingPlan& plan) : units_(plan.units), index_(unit_index(plan.local, plan.units)) {
    tied_ = plan.local.tied;
    for (size_t b : zero_pool_slot_bytes(units_)) slots_.push_back({b, -1, 0});
  }
  // Bytes gathered per group (0: dense, 1: experts), and whether the
  // replay is in a backward.
  int64_t gathered[2][2] = {{0, 0}, {0, 0}};
  int64_t gathers[2] = {0, 0};  // calls, per group
  bool in_backward = false;

  void forward(int unit) {
    const std::vector<int> need = units_for(unit);
    make_resident(need);
    if (unit + 1 < int(units_.size())) prefetch(unit + 1, need);
  }
  void backward(int unit) {
    const std::vector<int> need = units_for(unit);
    make_resident(need);
    if (unit > 0) prefetch(unit - 1, need);
  }

 private:
  struct Slot {
    size_t bytes;
    int unit;
    uint64_t used;
  };
  std::vector<UnitLayout> units_;
  UnitIndex index_;
  bool tied_ = false;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;

  std::vector<int> units_for(int unit) const {
    const UnitLayout& u = units_[size_t(unit)];
    if (u.kind == UnitKind::Layer || u.kind == UnitKind::Experts) return index_.layers[size_t(u.layer)];
    if (u.kind == UnitKind::Head && tied_ && index_.embedding >= 0) return {unit, index_.embedding};
    return {unit};
  }
  Slot* take(int unit, const std::vector<int>& pinned) {
    const size_t need = units_[size_t(unit)].bytes;
    Slot* best = nullptr;
    for (Slot& s : slots_) {
      if (s.bytes < need || std::find(pinned.begin(), pinned.end(), s.unit) != pinned.end()) continue;
      if (s.unit < 0)
        best = &s;
      else if (!best || (best->unit >= 0 && s.used < best->used))
        best = &s;
    }
    if (best) best->unit = -1;
    return best;
  }
  void gather(Slot& s, int unit) {
    s.unit = unit;
    s.used = ++clock_;
    const UnitLayout& u = units_[size_t(unit)];
    gathered[u.group == GradGroup::Edp ? 1 : 0][in_backward ? 1 : 0] += int64_t(u.bytes);
    if (u.bytes > 0) ++gathers[u.group == GradGroup::Edp ? 1 : 0];
  }
  bool resident(int unit, const std::vector<int>& pinned) {
    for (Slot& s : slots_)
      if (s.unit == unit) {
        s.used = ++clock_;
        return true;
      }
    Slot* s = take(unit, pinned);
    if (!s) return false;
    gather(*s, unit);
    return true;
  }
  void make_resident(std::vector<int> need) {
    std::sort(need.begin(), need.end(), [&](int a, int b) { return units_[size_t(a)].bytes > units_[size_t(b)].bytes; });
    for (int attempt = 0; attempt < 2; ++attempt) {
      bool ok = true;
      for (int u : need) ok = ok && resident(u, need);
      if (ok) return;
      for (Slot& s : slots_)
        if (std::find(need.begin(), need.end(), s.unit) != need.end()) s.unit = -1;
    }
  }
  void prefetch(int unit, const std::vector<int>& pinned) {
    for (const Slot& s : slots_)
      if (s.unit == unit) return;
    if (Slot* s = take(unit, pinned)) gather(*s, unit);
  }
};

// The order the model announces units in (model/transformer.cpp).
std::vector<int> forward_order(const UnitIndex& ix) {
  std::vector<int> o;
  if (ix.embedding >= 0) o.push_back(ix.embedding);
  for (const auto& layer : ix.layers) o.insert(o.end(), layer.begin(), layer.end());
  if (ix.head >= 0) o.push_back(ix.head);
  return o;
}

std::vector<int> backward_order(const UnitIndex& ix) {
  std::vector<int> o;
  if (ix.head >= 0) o.push_back(ix.head);
  for (auto it = ix.layers.rbegin(); it != ix.layers.rend(); ++it) o.insert(o.end(), it->begin(), it->end());
  if (ix.embedding >= 0) o.push_back(ix.embedding);
  return o;
}

}  // namespace

ZeroTraffic zero_traffic(const ShardingPlan& plan, int stage, int64_t micro_batches) {
  ZeroTraffic t;
  t.dense.size = plan.group_size(GradGroup::DpCp);
  t.expert.size = plan.group_size(GradGroup::Edp);
  auto group = [&](const UnitLayout& u) -> ZeroGroupTraffic& { return u.group == GradGroup::Edp ? t.expert : t.dense; };
  for (const UnitLayout& u : plan.units) {
    if (u.bytes == 0) continue;
    const int64_t b = int64_t(u.bytes);
    ZeroGroupTraffic& g = group(u);
    if (stage == 0 && u.shards > 1) g.all_reduce += b, ++g.all_reduce_calls;
    if (stage == 1 && u.shards > 1) g.reduce_scatter += b, ++g.reduce_scatter_calls;
    if (stage >= 2) g.reduce_scatter += b * micro_batches, g.reduce_scatter_calls += micro_batches;
    if ((stage == 1 || stage == 2) && u.shards > 1) g.all_gather += b, ++g.all_gather_calls;
  }
  if (stage < 3) return t;
  // Gathered weights from the replayed pool, micro-batch by micro-batch;
  // the optimizer step drops every gathered copy.
  const UnitIndex ix = unit_index(plan.local, plan.units);
  const std::vector<int> fwd = forward_order(ix), bwd = backward_order(ix);
  WeightPoolReplay pool(plan);
  for (int64_t mb = 0; mb < micro_batches; ++mb) {
    pool.in_backward = false;
    for (int u : fwd) pool.forward(u);
    pool.in_backward = true;
    for (int u : bwd) pool.backward(u);
  }
  for (int g = 0; g < 2; ++g) {
    ZeroGroupTraffic& z = g ? t.expert : t.dense;
    z.all_gather_forward = pool.gathered[g][0];
    z.all_gather_backward = pool.gathered[g][1];
    z.all_gather += z.all_gather_forward + z.all_gather_backward;
    z.all_gather_calls += pool.gathers[g];
  }
  return t;
}

}  // namespace trainer
