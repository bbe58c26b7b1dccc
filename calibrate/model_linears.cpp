#include "calibrate/model_linears.h"

#include <algorithm>

#include "model/dims.h"

namespace trainer {

namespace {

int64_t at_least_one(int64_t v) { return std::max<int64_t>(1, v); }

}  // namespace

std::vector<LinearShape> model_linears(const Config& c) {
  const ModelDims g = make_dims(c, c.train.micro_batch_size, c.train.seq_len);
  const int64_t tp = std::max(1, c.parallel.tp), ep = std::max(1, c.parallel.ep);
  const int64_t N = g.N(), C = g.C;
  // A kv head is replicated when there are fewer than tp of them.
  const int64_t q = at_least_one(g.Hq / tp) * g.D, kv = at_least_one(g.Hkv / tp) * g.D;
  int64_t moe = 0;
  for (int64_t i = 0; i < g.L; ++i) moe += g.moe_layer(i) ? 1 : 0;
  const double dense = double(g.L - moe);
  std::vector<LinearShape> all = {
      {"attn.wq", N, C, q, double(g.L)},
      {"attn.wk", N, C, kv, double(g.L)},
      {"attn.wv", N, C, kv, double(g.L)},
      {"attn.wo", N, q, C, double(g.L)},
      {"head", N, C, (g.V + tp - 1) / tp, 1},
  };
  const char* up = g.llama ? "mlp.w_up" : "mlp.w_fc";
  const char* down = g.llama ? "mlp.w_down" : "mlp.w_proj";
  if (dense > 0) {
    if (g.llama) all.push_back({"mlp.w_gate", N, C, g.F / tp, dense});
    all.push_back({up, N, C, g.F / tp, dense});
    all.push_back({down, N, g.F / tp, C, dense});
  }
  if (moe > 0) {
    const int64_t rows = at_least_one(ep * N * g.K / g.E);
    const double experts = double(moe) * double(g.E / ep);
    all.push_back({"moe.router", N, C, g.E, double(moe)});
    if (g.llama) all.push_back({"moe.w_gate", rows, C, g.Fm / tp, experts});
    all.push_back({g.llama ? "moe.w_up" : "moe.w_fc", rows, C, g.Fm / tp, experts});
    all.push_back({g.llama ? "moe.w_down" : "moe.w_proj", rows, g.Fm / tp, C, experts});
  }
  std::vector<LinearShape> out;
  for (const LinearShape& s : all) {
    auto same = std::find_if(out.begin(), out.end(),
                             [&](const LinearShape& o) { return o.rows == s.rows && o.in == s.in && o.out == s.out; });
    if (same == out.end()) {
      out.push_back(s);
    } else {
      same->name += "," + s.name;
      same->count += s.count;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LinearShape& a, const LinearShape& b) { return a.flops() > b.flops(); });
  return out;
}

}  // namespace trainer
