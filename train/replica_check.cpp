#include "train/replica_check.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "kernels/ops.h"
#include "runtime/distributed_run.h"
#include "train/stage_models.h"

namespace trainer {

namespace {

constexpr size_t kWords = sizeof(ReplicaRecord) / sizeof(uint64_t);
static_assert(sizeof(ReplicaRecord) == kWords * sizeof(uint64_t));

uint64_t what_index(const char* what) {
  for (size_t i = 0; i < std::size(kReplicaWhat); ++i)
    if (std::strcmp(kReplicaWhat[i], what) == 0) return i;
  throw std::logic_error(std::string("replica check: unknown piece kind '") + what + "'");
}

const char* group_label(uint64_t g) {
  switch (ReplicaGroup(g)) {
    case ReplicaGroup::DataParallel: return "data-parallel replicas";
    case ReplicaGroup::TensorParallel: return "tensor-parallel copies";
    case ReplicaGroup::PipelineEnds: return "pipeline ends (tied embedding)";
  }
  return "copies";
}

std::string rank_list(const std::vector<int>& ranks, const std::vector<std::string>& host_of_rank) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(ranks[i]);
    if (size_t(ranks[i]) < host_of_rank.size()) s += " on " + host_of_rank[size_t(ranks[i])];
  }
  return s;
}

// One set of copies of one piece, the records sorted by rank.
struct Copies {
  std::vector<const ReplicaRecord*> of;
  // The ranks outside the majority; `strong` when a majority exists. Without
  // one: every rank is a candidate, and `owner_bad` those that differ from
  // the shard owner's copy (empty when there is no owner).
  std::vector<int> bad, owner_bad;
  bool strong = false;
};

void judge_copies(Copies& c) {
  std::map<uint64_t, size_t> votes;
  for (const ReplicaRecord* r : c.of) ++votes[r->hash];
  for (const auto& [hash, n] : votes)
    if (2 * n > c.of.size()) {
      c.strong = true;
      for (const ReplicaRecord* r : c.of)
        if (r->hash != hash) c.bad.push_back(int(r->rank));
      return;
    }
  const int64_t owner = c.of.front()->owner;
  const ReplicaRecord* own = nullptr;
  for (const ReplicaRecord* r : c.of) {
    c.bad.push_back(int(r->rank));
    if (owner >= 0 && r->rank == owner) own = r;
  }
  if (own)
    for (const ReplicaRecord* r : c.of)
      if (r->hash != own->hash) c.owner_bad.push_back(int(r->rank));
}

std::vector<int> intersect(std::vector<int> a, const std::vector<int>& b) {
  std::vector<int> out;
  std::sort(a.begin(), a.end());
  std::vector<int> bs = b;
  std::sort(bs.begin(), bs.end());
  std::set_intersection(a.begin(), a.end(), bs.begin(), bs.end(), std::back_inserter(out));
  return out;
}

// Who to name among the sets that disagree, and how they were told apart
// (the order of the header's rules).
std::vector<int> suspects(const std::vector<Copies*>& differ, std::string& how) {
  std::set<int> named;
  for (const Copies* c : differ)
    if (c->strong) named.insert(c->bad.begin(), c->bad.end());
  if (!named.empty()) {
    how = "they disagree with the majority of their copies";
    return {named.begin(), named.end()};
  }
  std::vector<int> common = differ.front()->bad;
  for (const Copies* c : differ) common = intersect(common, c->bad);
  const bool narrows = !common.empty() && std::any_of(differ.begin(), differ.end(), [&](const Copies* c) {
    return c->bad.size() > common.size();
  });
  if (narrows) {
    how = "each set has two copies and no majority; these ranks are in every set that disagrees";
    return common;
  }
  const bool owned = std::all_of(differ.begin(), differ.end(), [](const Copies* c) { return !c->owner_bad.empty(); });
  for (const Copies* c : differ) {
    const std::vector<int>& these = owned ? c->owner_bad : c->bad;
    named.insert(these.begin(), these.end());
  }
  how = owned ? "two copies without a majority; these differ from their ZeRO shard's owner, whose update the "
                "all-gather sent (if the owner's own copy changed after the gather, it is the owner instead)"
              : "two copies without a majority: the check cannot tell which of them is wrong";
  return {named.begin(), named.end()};
}

}  // namespace

ReplicaVerdict judge_replicas(const std::vector<ReplicaRecord>& all, const std::vector<std::string>& names,
                              const std::vector<std::string>& host_of_rank) {
  // Sorted by parameter first: the first differing tensor is the first in the model's order.
  using Key = std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>;  // param, begin, what, group, set
  std::map<Key, Copies> sets;
  for (const ReplicaRecord& r : all) sets[{r.param, r.begin, r.what, r.group, r.set}].of.push_back(&r);
  ReplicaVerdict v;
  v.pieces = all.size();
  std::set<std::pair<uint64_t, uint64_t>> groups;
  std::vector<Copies*> differ;
  for (auto& [key, c] : sets) {
    groups.insert({std::get<3>(key), std::get<4>(key)});
    std::sort(c.of.begin(), c.of.end(), [](const ReplicaRecord* a, const ReplicaRecord* b) { return a->rank < b->rank; });
    if (c.of.size() < 2) continue;
    const bool same = std::all_of(c.of.begin(), c.of.end(), [&](const ReplicaRecord* r) { return r->hash == c.of[0]->hash; });
    if (same) continue;
    judge_copies(c);
    differ.push_back(&c);
  }
  v.sets = groups.size();
  if (differ.empty()) return v;
  v.ok = false;
  std::string how;
  v.ranks = suspects(differ, how);
  const Copies& c = *differ.front();
  const ReplicaRecord& r0 = *c.of.front();
  const std::string tensor = r0.param < names.size() ? names[size_t(r0.param)] : "parameter " + std::to_string(r0.param);
  std::vector<int> members;
  for (const ReplicaRecord* r : c.of) members.push_back(int(r->rank));
  std::set<std::string> tensors;
  for (const Copies* d : differ) {
    const uint64_t p = d->of.front()->param;
    tensors.insert(p < names.size() ? names[size_t(p)] : std::to_string(p));
  }
  v.message = "replicas disagree: rank" + std::string(v.ranks.size() > 1 ? "s " : " ") +
              rank_list(v.ranks, host_of_rank) + " (" + how + "). First differing tensor: '" + tensor + "' (" +
              kReplicaWhat[r0.what] + ", elements from " + std::to_string(r0.begin) + "), between the " +
              group_label(r0.group) + " of ranks " + rank_list(members, {}) + "; " + std::to_string(differ.size()) +
              " piece" + (differ.size() > 1 ? "s" : "") + " of " + std::to_string(tensors.size()) + " tensor" +
              (tensors.size() > 1 ? "s" : "") + " differ";
  return v;
}

std::vector<ReplicaRecord> replica_records(StageModels& models, DistributedRun& dist,
                                           const std::vector<ParamInfo>& global) {
  std::unordered_map<std::string, uint64_t> index;
  for (size_t i = 0; i < global.size(); ++i) index[global[i].spec.name] = i;
  const int rank = dist.host().rank();
  std::vector<ReplicaRecord> out;
  auto add = [&](ReplicaGroup g, int set, const Model& m, int param, const char* what, int64_t begin, Tensor t,
                 int owner) {
    const auto it = index.find(m.params[size_t(param)].spec.name);
    if (it == index.end())
      throw std::logic_error("replica check: '" + m.params[size_t(param)].spec.name + "' is not in the model");
    out.push_back({uint64_t(g), uint64_t(set), it->second, what_index(what), uint64_t(begin), ops::checksum(t), owner,
                   rank});
  };
  Communicator& pp = dist.pp_group();
  for (size_t c = 0; c < models.size(); ++c) {
    ZeroOptimizer& zero = models.zero(c);
    zero.settle();
    const Model& m = models.model(c);
    for (const ReplicaPiece& p : zero.replica_pieces())
      add(ReplicaGroup::DataParallel, p.group->members().front(), m, p.param, p.what, p.begin, p.t, p.owner);
    if (zero.stage() >= 3) continue;  // tp copies of a norm are dp shards there, cut where each tp rank's units fall
    for (size_t p = 0; p < m.params.size(); ++p) {
      const ParamPlacement& pl = m.placement[p];
      if (m.tp && m.tp->size() > 1) {
        const int tp_rank = m.tp->rank();
        if (!m.params[p].tp_split())
          add(ReplicaGroup::TensorParallel, m.tp->members().front(), m, int(p), "weights", 0, m.param_tensors[p], -1);
        else if (pl.kv_replicas > 1)
          add(ReplicaGroup::TensorParallel, m.tp->members()[size_t(tp_rank / pl.kv_replicas * pl.kv_replicas)], m,
              int(p), "weights", 0, m.param_tensors[p], -1);
      }
      if (pl.tie_sum && pp.size() > 1)
        add(ReplicaGroup::PipelineEnds, pp.members().front(), m, int(p), "weights", 0, m.param_tensors[p], -1);
    }
  }
  return out;
}

ReplicaVerdict check_replicas(StageModels& models, DistributedRun& dist, const std::vector<ParamInfo>& global,
                              const std::vector<std::string>& host_of_rank) {
  std::vector<ReplicaRecord> mine = replica_records(models, dist, global);
  Communicator& host = dist.host();
  std::vector<std::string> names;
  for (const ParamInfo& p : global) names.push_back(p.spec.name);
  if (host.size() == 1) return judge_replicas(mine, names, host_of_rank);
  // Ranks hold different numbers of pieces (pipeline stages): each sends the
  // most any rank has, the rest marked empty (rank -1).
  double most = double(mine.size());
  host.all_reduce(Tensor(&most, DType::F64, {1}), ReduceOp::Max);
  const size_t n = size_t(most);
  ReplicaRecord empty;
  empty.rank = -1;
  mine.resize(n, empty);
  std::vector<ReplicaRecord> all(n * size_t(host.size()));
  // The bytes travel as they are: F64 only names the element size.
  host.all_gather(Tensor(all.data(), DType::F64, {int64_t(all.size() * kWords)}),
                  Tensor(mine.data(), DType::F64, {int64_t(n * kWords)}));
  all.erase(std::remove_if(all.begin(), all.end(), [](const ReplicaRecord& r) { return r.rank < 0; }), all.end());
  return judge_replicas(all, names, host_of_rank);
}

}  // namespace trainer
