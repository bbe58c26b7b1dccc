// ZeRO's partition arithmetic (model/units.h, optim/zero_partition.h): the
// shards of all ranks cover every parameter element exactly once, never touch
// padding, start aligned, and have the same size on every rank.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "model/params.h"
#include "model/units.h"
#include "optim/zero_partition.h"
#include "trainer/config.h"

using namespace trainer;

namespace {
ModelDims dims_of(const std::string& model_yaml, DType storage) {
  const Config c = load_config_text("model: " + model_yaml + "\ndata: {train: [x.bin]}\n", "<test>", {});
  return make_dims(c, c.train.micro_batch_size, c.train.seq_len, storage);
}
}  // namespace

TEST_CASE("zero: every element is owned by exactly one rank, padding by none", "[zero]") {
  const std::vector<std::string> models = {
      "{arch: llama, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2}",
      "{arch: gpt2, d_model: 48, n_layers: 2, n_heads: 4, tie_embeddings: true}",
      "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, moe: {num_experts: 4, top_k: 2, every: 2}}"};
  for (const std::string& model : models)
    for (DType storage : {DType::F32, DType::BF16})
      for (int shards : {1, 2, 3, 4, 8}) {
        const ModelDims d = dims_of(model, storage);
        const auto params = parameter_list(d, 0.02);
        const auto units = unit_layout(d, params, shards);
        const size_t elem = dtype_size(storage);
        INFO(model << " " << dtype_name(storage) << " shards " << shards);
        REQUIRE(units.size() == size_t(d.L) + 2);
        std::vector<std::vector<int>> owner(params.size());
        for (size_t i = 0; i < params.size(); ++i) owner[i].assign(size_t(params[i].spec.numel()), 0);
        int64_t total_shard = -1;
        for (int r = 0; r < shards; ++r) {
          const auto off = shard_offsets(units, elem, shards);
          if (total_shard < 0) total_shard = off.back();
          CHECK(off.back() == total_shard);  // same shard size on every rank
          for (const ZeroPiece& p : shard_pieces(units, params, elem, shards, r)) {
            const UnitLayout& u = units[size_t(p.unit)];
            CHECK(p.param >= u.first);
            CHECK(p.param < u.end);
            const int64_t s = shard_elems(u, elem, shards);
            CHECK(p.unit_elem >= r * s);
            CHECK(p.unit_elem + p.count <= (r + 1) * s);
            for (int64_t e = 0; e < p.count; ++e) owner[size_t(p.param)][size_t(p.begin + e)] += 1;
          }
        }
        int wrong = 0;
        for (const auto& o : owner)
          for (int n : o) wrong += n != 1;
        CHECK(wrong == 0);
        size_t at = 0;
        for (const UnitLayout& u : units) {
          CHECK(u.offset == at);
          CHECK(u.bytes % (size_t(shards) * kArenaAlign) == 0);  // shards start 64-byte aligned
          at += u.bytes;
        }
        if (shards == 1) CHECK(units_total_bytes(units) == arena_bytes(specs_of(params)));
      }
}

TEST_CASE("zero: units follow the model's structure", "[zero]") {
  const ModelDims d = dims_of("{arch: gpt2, d_model: 32, n_layers: 2, n_heads: 4, tie_embeddings: false}", DType::F32);
  const auto params = parameter_list(d, 0.02);
  const auto units = unit_layout(d, params, 2);
  auto names = [&](int u) {
    std::string s;
    for (int i = units[size_t(u)].first; i < units[size_t(u)].end; ++i) s += params[size_t(i)].spec.name + " ";
    return s;
  };
  CHECK(names(embedding_unit()) == "tok_embed.weight pos_embed.weight ");
  CHECK(names(layer_unit(1)).rfind("layers.1.attn_norm.weight", 0) == 0);
  CHECK(names(layer_unit(1)).find("layers.0") == std::string::npos);
  CHECK(names(head_unit(d)) == "final_norm.weight final_norm.bias lm_head.weight ");
}
