// The sharding plan (model/sharding.h) for every layout tp x pp x dp x cp x
// ep of at most 16 ranks and three test models: every element of every
// global tensor is held by every member of its gradient group and by
// exactly one (tp, pp, ep) position of each replica (every tp position for a
// tensor tp does not cut, both pipeline ends for a tied table); the members
// of a group hold the same box; ZeRO shards partition each rank's slices; each tensor's group is
// the one in the table below; every rank's initial slice equals the slice of
// the one-process tensor bit for bit.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "model/sharding.h"
#include "optim/zero_partition.h"

using namespace trainer;

namespace {

struct TestModel {
  const char* label;
  const char* yaml;
};
// Sizes that divide by 1, 2 and 4 (and some by 8 and 16), so most layouts
// are valid; the others must be refused naming the key.
const TestModel kModels[] = {
    {"llama GQA", "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 4, n_heads: 8, n_kv_heads: 4, d_ff: 64}"},
    // A prime vocabulary: every tp > 1 pads it (the last rank's trailing rows).
    {"gpt2 tied", "{arch: gpt2, vocab_size: 61, d_model: 32, n_layers: 3, n_heads: 4, tie_embeddings: true}"},
    {"llama MoE",
     "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, moe: {num_experts: 4, top_k: 2, "
     "every: 2, d_ff: 32}}"},
};

ModelDims dims_of(const char* yaml) {
  const Config c = load_config_text(std::string("model: ") + yaml + "\ndata: {train: [x.bin]}\n", "<test>", {});
  return make_dims(c, 1, 8);
}

struct Layout {
  MeshShape mesh;
  std::string label() const {
    return "tp" + std::to_string(mesh.tp) + " pp" + std::to_string(mesh.pp) + " dp" + std::to_string(mesh.dp) + " cp" +
           std::to_string(mesh.cp) + " ep" + std::to_string(mesh.ep);
  }
};

std::vector<Layout> all_layouts(int max_world) {
  std::vector<Layout> out;
  for (int tp = 1; tp <= max_world; ++tp)
    for (int pp = 1; tp * pp <= max_world; ++pp)
      for (int dp = 1; tp * pp * dp <= max_world; ++dp)
        for (int cp = 1; tp * pp * dp * cp <= max_world; ++cp)
          for (int ep = 1; ep <= dp * cp; ++ep)
            if ((dp * cp) % ep == 0) {
              Layout l;
              l.mesh.tp = tp;
              l.mesh.pp = pp;
              l.mesh.dp = dp;
              l.mesh.cp = cp;
              l.mesh.ep = ep;
              out.push_back(l);
            }
  return out;
}

// The expected gradient group of each tensor, by name.
struct GroupRule {
  const char* pattern;
  GradGroup group;
  bool tp_sum_under_sp;
};
const GroupRule kRules[] = {
    {R"(tok_embed\.weight)", GradGroup::DpCp, false},
    {R"(pos_embed\.weight)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.(attn|mlp)_norm\.(weight|bias))", GradGroup::DpCp, true},
    {R"(layers\.\d+\.attn\.w[qkv]\.(weight|bias))", GradGroup::DpCp, false},
    {R"(layers\.\d+\.attn\.wo\.weight)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.attn\.wo\.bias)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.mlp\.w_(gate|up|down|fc|proj)\.weight)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.mlp\.w_fc\.bias)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.mlp\.w_proj\.bias)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.moe\.router\.weight)", GradGroup::DpCp, false},
    {R"(layers\.\d+\.moe\.w_(gate|up|down|fc|proj))", GradGroup::Edp, false},
    {R"(final_norm\.(weight|bias))", GradGroup::DpCp, true},
    {R"(lm_head\.weight)", GradGroup::DpCp, false},
};

const GroupRule* rule_for(const std::string& name) {
  static std::map<std::string, const GroupRule*> cache;
  static const std::vector<std::regex> patterns = [] {
    std::vector<std::regex> v;
    for (const GroupRule& r : kRules) v.emplace_back(r.pattern);
    return v;
  }();
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const GroupRule* found = nullptr;
  for (size_t i = 0; i < patterns.size() && !found; ++i)
    if (std::regex_match(name, patterns[i])) found = &kRules[i];
  return cache[name] = found;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// fn(global index of the row's first element, local index of it, length)
// for every row (last dimension) of p's slice inside the global tensor
// (padding rows of a vocabulary tp does not divide are left out): rows are
// contiguous in both.
template <typename Fn>
void for_each_row(const ParamInfo& p, Fn fn) {
  const auto& s = p.spec.shape;
  const size_t nd = s.size();
  const int64_t row = s[nd - 1], rows = p.box_numel() / row;
  std::vector<int64_t> idx(nd, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t g = 0;
    for (size_t k = 0; k < nd; ++k) g = g * p.global_shape[k] + p.offset[k] + (k + 1 < nd ? idx[k] : 0);
    fn(g, r * row, row);
    for (size_t k = nd - 1; k-- > 0;) {  // next row: odometer over the leading dims
      if (++idx[k] < s[k]) break;
      idx[k] = 0;
    }
  }
}

// The name and the box, as text (appended piecewise: GCC 12 misreports a
// chain of string + as overlapping memcpy, -Wrestrict).
std::string box_key(const ParamInfo& p) {
  std::string k = p.spec.name;
  for (size_t i = 0; i < p.offset.size(); ++i) {
    k += ' ';
    k += std::to_string(p.offset[i]);
    k += '+';
    k += std::to_string(p.spec.shape[i]);
  }
  return k;
}

}  // namespace

TEST_CASE("sharding plan: every layout up to 16 ranks covers each tensor once per replica, groups as the table says",
          "[sharding]") {
  int valid = 0, refused = 0, checked_ranks = 0, init_slices = 0;
  for (const TestModel& tm : kModels) {
    const ModelDims g = dims_of(tm.yaml);
    // The one-process tensors, for the init check.
    const ShardingPlan whole = single_plan(g, 0.02);
    std::map<std::string, std::vector<float>> reference;
    for (const ParamInfo& p : whole.params) reference[p.spec.name] = initial_values(p, 42);
    std::map<std::string, bool> init_checked;  // by box: equal boxes give equal values

    for (const Layout& l : all_layouts(16)) {
      for (bool sp : {false, true}) {
        if (sp && l.mesh.tp == 1) continue;
        INFO(tm.label << ", " << l.label() << (sp ? " sp" : ""));
        const int world = l.mesh.world();
        std::vector<ShardingPlan> plans;
        try {
          for (int r = 0; r < world; ++r) plans.push_back(make_sharding_plan(g, 0.02, l.mesh, coords_of(l.mesh, r), 1, sp));
        } catch (const ConfigError& e) {
          // Only divisibility may refuse a layout, and the message names the key.
          const std::string msg = e.what();
          CHECK((msg.find("model.") != std::string::npos || msg.find("parallel.") != std::string::npos));
          ++refused;
          continue;
        }
        ++valid;
        // coverage[name][global element] = ranks holding it (not repeated for sp)
        std::map<std::string, std::vector<int>> coverage;
        std::map<std::string, int> expected;  // group size x stage copies
        std::vector<std::map<std::string, std::string>> boxes(static_cast<size_t>(world));
        for (int r = 0; r < world; ++r)
          for (const ParamInfo& p : plans[size_t(r)].params) boxes[size_t(r)][p.spec.name] = box_key(p);
        for (int r = 0; r < world; ++r) {
          const ShardingPlan& pl = plans[size_t(r)];
          REQUIRE(pl.params.size() == pl.placement.size());
          for (size_t i = 0; i < pl.params.size(); ++i) {
            const ParamInfo& p = pl.params[i];
            const ParamPlacement& where = pl.placement[i];
            if (!sp) {
              auto& cov = coverage[p.spec.name];
              if (cov.empty()) cov.assign(size_t(numel(p.global_shape)), 0);
              REQUIRE(int64_t(cov.size()) == numel(p.global_shape));
              for_each_row(p, [&](int64_t g0, int64_t, int64_t n) {
                for (int64_t e = 0; e < n; ++e) cov[size_t(g0 + e)] += 1;
              });
            }
            // Copies: the gradient group's members, both pipeline ends of a
            // tied table, and every tp rank for a tensor tp does not cut.
            const bool tp_whole = !p.tp_split();
            // Of identical replicas, one is saved (and counted in the norm).
            CHECK(where.saved == (where.stages.front() == pl.at.pp &&
                                  (tp_whole ? pl.at.tp == 0 : pl.at.tp % where.kv_replicas == 0)));
            const int copies = int(where.stages.size()) * (tp_whole ? l.mesh.tp : where.kv_replicas);
            const int want = pl.group_size(where.group) * copies;
            auto [it, fresh] = expected.emplace(p.spec.name, want);
            CHECK(it->second == want);
            // The group table.
            const GroupRule* rule = rule_for(p.spec.name);
            INFO(p.spec.name);
            REQUIRE(rule != nullptr);
            CHECK(where.group == rule->group);
            CHECK(where.tp_sum == (sp && rule->tp_sum_under_sp));
            CHECK(where.tie_sum == (p.spec.name == "tok_embed.weight" && g.tied && l.mesh.pp > 1));
            CHECK(where.unit >= 0);
            CHECK(pl.units[size_t(where.unit)].group == where.group);
            // Every member of the gradient group holds the same box.
            const Axis axis = where.group == GradGroup::DpCp ? Axis::DP_CP : Axis::EDP;
            const std::string& mine = boxes[size_t(r)][p.spec.name];
            for (int peer : group_ranks(l.mesh, r, axis)) {
              auto it2 = boxes[size_t(peer)].find(p.spec.name);
              CHECK((it2 != boxes[size_t(peer)].end() && it2->second == mine));
            }
            // ... and so does every tp rank when tp does not cut it.
            if (tp_whole)
              for (int peer : group_ranks(l.mesh, r, Axis::TP)) {
                auto it2 = boxes[size_t(peer)].find(p.spec.name);
                CHECK((it2 != boxes[size_t(peer)].end() && it2->second == mine));
              }
            // Initial values: the slice of the one-process tensor, bit for bit.
            if (!init_checked[mine]) {
              init_checked[mine] = true;
              const std::vector<float> local = initial_values(p, 42);
              const std::vector<float>& ref = reference.at(p.spec.name);
              int64_t diff = 0;
              for_each_row(p, [&](int64_t g0, int64_t j0, int64_t n) {
                diff += std::memcmp(&local[size_t(j0)], &ref[size_t(g0)], size_t(n) * 4) != 0;
              });
              // Padding rows start (and stay) zero.
              for (int64_t e = p.box_numel(); e < p.spec.numel(); ++e) diff += local[size_t(e)] != 0.f;
              CHECK(diff == 0);
              ++init_slices;
            }
          }
          // ZeRO: the shards of the group members partition each unit's slices.
          ++checked_ranks;
        }
        for (const auto& [name, cov] : coverage) {
          INFO(name);
          int64_t wrong = 0;
          for (int c : cov) wrong += c != expected[name];
          CHECK(wrong == 0);
        }
        // ZeRO shards, on the first rank of each dp x cp group position 0: the
        // group members' pieces of every unit cover each element once.
        for (int r = 0; r < world; ++r) {
          const ShardingPlan& pl = plans[size_t(r)];
          if (pl.group_rank(GradGroup::DpCp) != 0 || pl.edp_rank != 0) continue;
          std::vector<std::vector<int>> owner(pl.params.size());
          for (size_t i = 0; i < pl.params.size(); ++i) owner[i].assign(size_t(pl.params[i].spec.numel()), 0);
          for (size_t u = 0; u < pl.units.size(); ++u)
            for (int s = 0; s < pl.units[u].shards; ++s) {
              std::vector<int> ranks(pl.units.size(), 0);
              ranks[u] = s;
              for (const ZeroPiece& zp : shard_pieces(pl.units, pl.params, 4, ranks))
                if (zp.unit == int(u))
                  for (int64_t e = 0; e < zp.count; ++e) owner[size_t(zp.param)][size_t(zp.begin + e)] += 1;
            }
          int64_t wrong = 0;
          for (const auto& o : owner)
            for (int n : o) wrong += n != 1;
          CHECK(wrong == 0);
        }
      }
    }
  }
  std::printf("[sharding] %d layouts planned (%d rank plans checked), %d refused for divisibility; %d distinct "
              "initial slices equal the one-process tensors bit for bit\n",
              valid, checked_ranks, refused, init_slices);
  CHECK(valid > 300);
}

TEST_CASE("sharding plan: local dims, pipeline stages, refusals name the key", "[sharding]") {
  const ModelDims g = dims_of(kModels[0].yaml);
  MeshShape mesh;
  mesh.tp = 2;
  mesh.pp = 2;
  mesh.dp = 2;
  Coords at;
  at.tp = 1;
  at.pp = 1;
  const ShardingPlan p = make_sharding_plan(g, 0.02, mesh, at, 0);
  CHECK(p.local.Hq == 4);
  CHECK(p.local.Hkv == 2);
  CHECK(p.local.F == 32);
  CHECK(p.local.V == 32);
  CHECK(p.local.L == 2);
  CHECK(p.local.first_layer == 2);
  CHECK_FALSE(p.local.has_embedding);
  CHECK(p.local.has_head);
  CHECK(p.params.front().spec.name == "layers.2.attn_norm.weight");
  CHECK(p.params.back().spec.name == "lm_head.weight");
  CHECK(p.params.back().offset == std::vector<int64_t>{32, 0});
  CHECK(p.params.back().global_shape == std::vector<int64_t>{64, 32});
  CHECK(p.stage_layers == std::vector<int64_t>{2, 2});
  CHECK(even_stage_layers(7, 3) == std::vector<int64_t>{3, 2, 2});
  CHECK(make_sharding_plan(g, 0.02, mesh, at, 0, false, {1, 3}).local.first_layer == 1);

  // A vocabulary tp does not divide is padded: 61 ids over tp 4 are 16 rows
  // per rank, the last rank's final 3 rows padding.
  {
    MeshShape m4;
    m4.tp = 4;
    Coords last;
    last.tp = 3;
    const ShardingPlan v = make_sharding_plan(dims_of(kModels[1].yaml), 0.02, m4, last, 0);
    CHECK(v.local.V == 16);
    CHECK(v.local.V_offset == 48);
    CHECK(v.local.V_valid() == 13);
    CHECK(v.local.vocab() == 61);
    const ParamInfo& emb = v.params.front();
    REQUIRE(emb.spec.name == "tok_embed.weight");
    CHECK(emb.spec.shape == std::vector<int64_t>{16, 32});
    CHECK(emb.global_shape == std::vector<int64_t>{61, 32});
    CHECK(emb.offset == std::vector<int64_t>{48, 0});
    CHECK(emb.box_shape == std::vector<int64_t>{13, 32});
  }

  auto refused = [&](MeshShape m, const std::string& key) {
    try {
      make_sharding_plan(g, 0.02, m, Coords{}, 0);
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(key) != std::string::npos);
      return;
    }
    FAIL("layout accepted, expected a refusal naming " << key);
  };
  MeshShape m;
  m.tp = 3;
  refused(m, "model.n_heads");
  // 8 tp ranks over 4 kv heads: each kv head on 2 ranks (no refusal).
  m.tp = 8;
  {
    Coords r5;
    r5.tp = 5;
    const ShardingPlan kv = make_sharding_plan(g, 0.02, m, r5, 0);
    CHECK(kv.local.Hkv == 1);
    CHECK(kv.local.Hq == 1);
    for (size_t i = 0; i < kv.params.size(); ++i)
      if (kv.params[i].spec.name == "layers.0.attn.wk.weight") {
        CHECK(kv.params[i].offset[0] == 2 * g.D);  // kv head 5 / 2 = 2
        CHECK(kv.placement[i].kv_replicas == 2);
        CHECK_FALSE(kv.placement[i].saved);      // rank 4 saves kv head 2
      }
  }
  {
    // Neither divides the other: refused naming both keys.
    ModelDims odd = g;
    odd.Hq = 12;
    odd.Hkv = 6;
    MeshShape m4;
    m4.tp = 4;
    try {
      make_sharding_plan(odd, 0.02, m4, Coords{}, 0);
      FAIL("6 kv heads over tp 4 accepted");
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find("model.n_kv_heads=6 and parallel.tp=4") != std::string::npos);
    }
  }
  m = MeshShape{};
  m.pp = 5;
  refused(m, "model.n_layers");
  m = MeshShape{};
  m.dp = 2;
  m.ep = 2;
  refused(m, "model.moe.num_experts");
}
