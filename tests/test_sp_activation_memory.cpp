// Sequence parallelism keeps a layer's saved activations at 1/tp, as in
// Megatron's accounting (Korthikanti et al. 2022, "Reducing Activation
// Recomputation in Large Transformer Models"): a GPT-3 layer with tp and sp,
// attention scores not stored, holds 34 s b h / t bytes in 16-bit storage
// (2 bytes a value, 1 byte a dropout mask). This model differs in what it
// keeps, and the expected bytes are that accounting term by term:
//   - no dropout: GPT-3's two sbh-byte masks (after attention and after the
//     FFN) are not there, 34 -> 32;
//   - grouped-query attention: K and V are 2 s b (Hkv D) each, not 2 s b h;
//   - the FFN keeps its input (2 s b h) and, GELU (gpt2), its pre- and
//     post-activation (2 s b F each; GPT-3's F = 4h makes 16 s b h), or,
//     SwiGLU (llama), gate, up and their product (2 s b F each);
//   - F32 statistics Megatron leaves out: a norm's rstd (and LayerNorm's
//     mean) per token, flash attention's log-sum-exp per token and head.
// The per-layer bytes of the plan (what the arenas hold: test_tp_accounting)
// must be within 5% of the term-by-term count without the statistics, and
// equal to it with them.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "config/config.h"
#include "model/activations.h"
#include "model/sharding.h"

using namespace trainer;

namespace {

struct Shape {
  const char* label;
  const char* model;
  int64_t s, b;
};

// Megatron's terms for this model, in bytes, per layer and tp rank.
struct Expected {
  double matrices = 0;  // the 16-bit tensors
  double statistics = 0;
};

Expected megatron_terms(const ModelDims& g, int t) {
  const double s = double(g.T), b = double(g.B), h = double(g.C), F = double(g.F);
  const double kv = double(g.Hkv * g.D);
  Expected e;
  const double attention = 2 * s * b * h /* norm input */ + 2 * s * b * h /* QKV input */ + 2 * s * b * h /* Q */ +
                           2 * 2 * s * b * kv /* K, V */ + 2 * s * b * h /* output projection input */;
  const double ffn = 2 * s * b * h /* norm input */ + 2 * s * b * h /* FFN input */ +
                     (g.llama ? 3 : 2) * 2 * s * b * F /* gate, up, product | pre, post GELU */;
  e.matrices = (attention + ffn) / t;
  const double norms = 2 * (g.llama ? 1 : 2) * 4 * s * b;  // rstd (and mean), F32
  e.statistics = (norms + 4 * s * b * double(g.Hq)) / t;    // + lse per head
  return e;
}

double layer_bytes(const ModelDims& local) {
  double bytes = 0;
  for (const TensorSpec& t : activation_specs(local))
    if (t.name.rfind("layers.0.", 0) == 0) bytes += double(t.bytes());
  return bytes;
}

}  // namespace

TEST_CASE("sequence parallel: a layer's activations are Megatron's 34 sbh/t, term by term", "[tp][memory][sp]") {
  const Shape shapes[] = {
      // GPT-3's layer shape (MHA, GELU, F = 4h): 32 sbh/t without dropout masks.
      {"gpt2 h2048 a16 (GPT-3-like)", "{arch: gpt2, d_model: 2048, n_layers: 1, n_heads: 16, max_seq_len: 2048}", 2048,
       1},
      // Llama 2 7B: SwiGLU F = 11008, MHA.
      {"llama h4096 F11008 (7B)", "{arch: llama, d_model: 4096, n_layers: 1, n_heads: 32, d_ff: 11008}", 4096, 1},
      // Llama 3 8B: GQA 8 kv heads, F = 14336.
      {"llama h4096 GQA8 F14336 (8B)",
       "{arch: llama, d_model: 4096, n_layers: 1, n_heads: 32, n_kv_heads: 8, d_ff: 14336}", 8192, 1},
  };
  for (const Shape& sh : shapes)
    for (int t : {2, 8}) {
      const Config c = load_config_text(std::string("model: ") + sh.model + "\ndata: {train: [x.bin]}\n",
                                        "<test>", {});
      const ModelDims g = make_dims(c, sh.b, sh.s, DType::BF16);
      MeshShape mesh;
      mesh.tp = t;
      const ShardingPlan plan = make_sharding_plan(g, 0.02, mesh, Coords{}, 0, /*sp=*/true);
      const double have = layer_bytes(plan.local);
      const Expected want = megatron_terms(g, t);
      const double sbh_t = double(g.T * g.B * g.C) / t;
      const double rel = std::fabs(have - want.matrices) / want.matrices;
      std::printf("[sp] %-30s tp %d: plan %.1f sbh/t per layer, Megatron's terms %.1f sbh/t (+ %.2f F32 statistics); "
                  "%.2f%% off (limit 5%%)\n",
                  sh.label, t, have / sbh_t, want.matrices / sbh_t, want.statistics / sbh_t, 100 * rel);
      INFO(sh.label << " tp " << t);
      CHECK(rel < 0.05);
      CHECK(have == Approx(want.matrices + want.statistics).epsilon(1e-12));
      if (!g.llama) CHECK(want.matrices / sbh_t == Approx(34 - 2));  // GPT-3 less its two dropout masks
    }
}
