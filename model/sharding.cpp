#include "model/sharding.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

#include "config/config.h"

namespace trainer {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void need_divisible(int64_t n, int parts, const std::string& what, const std::string& axis) {
  if (parts > 1 && n % parts != 0)
    throw ConfigError(what + "=" + str(n) + " must be divisible by " + axis + "=" + str(parts) + " (each rank holds " +
                      what.substr(what.rfind('.') + 1) + " / " + axis.substr(axis.rfind('.') + 1) +
                      "); change one of them");
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The key/value projections (and their biases): the rows of the kv heads.
bool is_kv(const std::string& name) {
  for (const char* t : {"attn.wk.weight", "attn.wv.weight", "attn.wk.bias", "attn.wv.bias"})
    if (ends_with(name, t)) return true;
  return false;
}

}  // namespace

int ShardingPlan::group_size(GradGroup g) const { return g == GradGroup::DpCp ? mesh.dp * mesh.cp : mesh.edp(); }

int ShardingPlan::group_rank(GradGroup g) const { return g == GradGroup::DpCp ? at.dp * mesh.cp + at.cp : edp_rank; }

std::vector<int64_t> even_stage_layers(int64_t layers, int stages) {
  if (stages < 1) throw std::invalid_argument("even_stage_layers: stages must be >= 1");
  if (layers < stages)
    throw ConfigError("model.n_layers=" + str(layers) + " is less than parallel.pp=" + str(stages) +
                      ": every pipeline stage needs at least one layer");
  std::vector<int64_t> out(size_t(stages), layers / stages);
  for (int64_t s = 0; s < layers % stages; ++s) ++out[size_t(s)];
  return out;
}

ShardingPlan make_sharding_plan(const ModelDims& global, double init_std, const MeshShape& mesh, const Coords& at,
                                int zero_stage, bool sp, std::vector<int64_t> stage_layers) {
  ShardingPlan plan;
  plan.mesh = mesh;
  plan.at = at;
  plan.zero_stage = zero_stage;
  plan.sp = sp && mesh.tp > 1;
  plan.global = global;
  if (at.tp < 0 || at.tp >= mesh.tp || at.pp < 0 || at.pp >= mesh.pp || at.dp < 0 || at.dp >= mesh.dp || at.cp < 0 ||
      at.cp >= mesh.cp)
    throw std::out_of_range("make_sharding_plan: coordinates outside the mesh");
  if (mesh.ep < 1 || (mesh.dp * mesh.cp) % mesh.ep != 0)
    throw ConfigError("parallel.ep=" + str(mesh.ep) + " must divide dp x cp = " + str(mesh.dp * mesh.cp));
  const int m = at.dp * mesh.cp + at.cp;  // position in dp x cp (comm/mesh.h)
  plan.ep_rank = m % mesh.ep;
  plan.edp_rank = m / mesh.ep;

  // The model must divide over the mesh.
  const int tp = mesh.tp, ep = mesh.ep;
  need_divisible(global.Hq, tp, "model.n_heads", "parallel.tp");
  // Key/value heads: split when tp divides them; with fewer kv heads than tp
  // ranks (grouped-query attention) each kv head is replicated on the
  // tp / n_kv_heads ranks whose query heads read it.
  const int kv_rep = global.Hkv % tp == 0 ? 1 : tp % global.Hkv == 0 ? int(tp / global.Hkv) : 0;
  if (kv_rep == 0)
    throw ConfigError("model.n_kv_heads=" + str(global.Hkv) + " and parallel.tp=" + str(tp) +
                      ": one must divide the other (tp splits the key/value heads, or replicates each on tp / "
                      "n_kv_heads ranks); change one of them");
  // The vocabulary need not divide: it is padded to a multiple of tp (below).
  bool any_dense = false;
  for (int64_t i = 0; i < global.L; ++i) any_dense |= !global.moe_layer(i);
  if (any_dense) need_divisible(global.F, tp, "model.d_ff", "parallel.tp");
  if (ep > 1 && global.E == 0)
    throw ConfigError("parallel.ep=" + str(ep) + " splits experts, but the model has none (model.moe.num_experts=0)");
  if (global.E > 0) {
    need_divisible(global.E, ep, "model.moe.num_experts", "parallel.ep");
    need_divisible(global.Fm, tp, "model.moe.d_ff", "parallel.tp");
  }
  if (stage_layers.empty()) stage_layers = even_stage_layers(global.L, mesh.pp);
  if (int(stage_layers.size()) != mesh.pp)
    throw ConfigError("the pipeline layer split has " + str(int64_t(stage_layers.size())) + " stages, parallel.pp=" +
                      str(mesh.pp));
  int64_t total = 0;
  for (int64_t n : stage_layers) {
    if (n < 1) throw ConfigError("every pipeline stage needs at least one layer");
    total += n;
  }
  if (total != global.L)
    throw ConfigError("the pipeline layer split sums to " + str(total) + " layers, model.n_layers=" + str(global.L));
  plan.stage_layers = stage_layers;

  // What this rank computes with.
  ModelDims& d = plan.local;
  d = global;
  d.Hq /= tp;
  d.Hkv = kv_rep > 1 ? 1 : global.Hkv / tp;
  d.F /= tp;
  d.tp = tp;
  d.sp = plan.sp;
  if (mesh.cp > 1) {
    if (global.T % (2 * int64_t(mesh.cp)) != 0)
      throw ConfigError("train.seq_len=" + str(global.T) + " must be divisible by 2 x parallel.cp = " +
                        str(2 * int64_t(mesh.cp)) + " (each context-parallel rank holds two equal chunks)");
    d.T = global.T / mesh.cp;
    d.cp = mesh.cp;
    d.cp_rank = at.cp;
  }
  d.vocab_size = global.vocab();
  d.V = (global.vocab() + tp - 1) / tp;  // padded: the last rank's trailing rows are padding
  d.V_offset = d.V * at.tp;
  if (global.E > 0) {
    d.E_local = global.E / ep;  // the router still scores every expert
    d.ep = ep;
    d.Fm /= tp;
  }
  d.first_layer = std::accumulate(stage_layers.begin(), stage_layers.begin() + at.pp, int64_t(0));
  d.L = stage_layers[size_t(at.pp)];
  d.model_layers = global.L;
  d.has_embedding = at.pp == 0;
  d.has_head = at.pp == mesh.pp - 1;

  // Each local slice's place in the global tensor; the global list checks it.
  std::map<std::string, std::vector<int64_t>> global_shapes;
  {
    ModelDims whole = global;
    whole.first_layer = 0;
    whole.model_layers = 0;
    whole.has_embedding = whole.has_head = true;
    for (const ParamInfo& p : parameter_list(whole, init_std)) global_shapes[p.spec.name] = p.spec.shape;
  }
  plan.params = parameter_list(d, init_std);
  for (ParamInfo& p : plan.params) {
    const auto& shape = p.spec.shape;
    for (size_t k = 0; k < shape.size(); ++k) {
      const int parts = p.cuts[k] == Cut::TP ? tp : p.cuts[k] == Cut::EP ? ep : 1;
      const int index = p.cuts[k] == Cut::TP ? at.tp : p.cuts[k] == Cut::EP ? plan.ep_rank : 0;
      p.global_shape[k] = shape[k] * parts;
      p.offset[k] = shape[k] * index;
      p.box_shape[k] = shape[k];
    }
    // A replicated kv head: rank r holds kv head r / kv_rep.
    if (kv_rep > 1 && is_kv(p.spec.name)) {
      p.global_shape[0] = shape[0] * global.Hkv;
      p.offset[0] = shape[0] * (at.tp / kv_rep);
    }
    // Vocabulary rows: the real vocabulary, of which this rank holds V_valid.
    if (p.spec.name == "tok_embed.weight" || p.spec.name == "lm_head.weight") {
      p.global_shape[0] = global.vocab();
      p.box_shape[0] = d.V_valid();
    }
    auto it = global_shapes.find(p.spec.name);
    if (it == global_shapes.end() || it->second != p.global_shape)
      throw std::logic_error("make_sharding_plan: the slice of '" + p.spec.name +
                             "' does not fit the global parameter list");
  }

  plan.units = unit_layout(d, plan.params, plan.group_size(GradGroup::DpCp), plan.group_size(GradGroup::Edp));
  plan.placement.resize(plan.params.size());
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (int i = plan.units[u].first; i < plan.units[u].end; ++i) plan.placement[size_t(i)].unit = int(u);
  const int last = mesh.pp - 1;
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const ParamInfo& p = plan.params[i];
    ParamPlacement& pl = plan.placement[i];
    const std::string& name = p.spec.name;
    pl.group = p.expert() ? GradGroup::Edp : GradGroup::DpCp;
    // Under sequence parallelism only the norms see this rank's token rows
    // alone; every other tensor whole on each tp rank (row biases, the
    // router, position table) gets its gradient from full-sequence
    // (gathered) inputs, identical on every tp rank.
    pl.tp_sum = plan.sp && !p.tp_split() && name.find("norm.") != std::string::npos;
    if (starts_with(name, "layers."))
      pl.stages = {at.pp};
    else if (name == "tok_embed.weight" && global.tied && mesh.pp > 1)
      pl.stages = {0, last};
    else if (starts_with(name, "tok_embed.") || starts_with(name, "pos_embed."))
      pl.stages = {0};
    else
      pl.stages = {last};
    pl.tie_sum = pl.stages.size() > 1;
    pl.kv_replicas = kv_rep > 1 && is_kv(name) ? kv_rep : 1;
    // One copy of identical replicas is saved and counted in the gradient
    // norm: the first stage's copy of a tied table, tp rank 0's copy of a
    // tensor tp does not cut.
    pl.saved = pl.stages.front() == at.pp && (p.tp_split() ? at.tp % pl.kv_replicas == 0 : at.tp == 0);
  }
  return plan;
}

ShardingPlan single_plan(const ModelDims& d, double init_std, int zero_stage, int dp, int dp_rank) {
  MeshShape mesh;
  mesh.dp = dp;
  Coords at;
  at.dp = dp_rank;
  return make_sharding_plan(d, init_std, mesh, at, zero_stage);
}

}  // namespace trainer
