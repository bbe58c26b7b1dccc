// Separate documents (data.documents: separate) from the data to the mesh.
//
// - The sampler reads a Megatron dataset's document index: each window says
//   where every token's document starts, and the target that would predict
//   the next document's first token is -1; files without documents are
//   refused, naming the file.
// - One process: the loss and every gradient of a packed row of several
//   documents equal the sums over those documents run one by one as their
//   own sequences (llama with RoPE, gpt2 with learned positions), to the
//   fp32 floor.
// - The binary on CPU processes: cp 2 x tp 2 (sp), pp 2 x dp 2 and MoE under
//   cp 2 x ep 2 with separate documents reproduce the one-process run with
//   separate documents (losses, validation losses, final weights), which the
//   test above ties to the documents one by one.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "data/batch_sampler.h"
#include "e2e_util.h"
#include "model/params.h"
#include "model/transformer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// Documents of lengths cycling through `lengths` until `total` tokens.
std::vector<int64_t> doc_sizes(int64_t total, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> s;
  for (int64_t at = 0, i = 0; at < total; ++i) {
    const int64_t n = std::min(lengths[size_t(i) % lengths.size()], total - at);
    s.push_back(n);
    at += n;
  }
  return s;
}

ModelDims tiny(bool llama, int64_t T, bool documents) {
  ModelDims d;
  d.llama = llama;
  d.B = 1;
  d.T = T;
  d.C = 16;
  d.V = 13;
  d.L = 2;
  d.Hq = 4;
  d.Hkv = llama ? 2 : 4;
  d.D = 4;
  d.F = 24;
  d.max_seq = 32;
  d.qkv_bias = d.o_bias = !llama;
  d.documents = documents;
  return d;
}

struct Result {
  double loss = 0;
  std::vector<std::vector<float>> grads;
};

// One forward and backward of ids/targets (and doc_start) on a model with
// `params`' values; gradients are sums (scale 1).
Result run(const ModelDims& d, const std::vector<std::vector<float>>& params, const std::vector<int32_t>& ids,
           const std::vector<int32_t>& targets, const std::vector<int32_t>& doc_start) {
  Model m;
  build_model(m, d, 0.3, Device::CPU);
  for (size_t i = 0; i < params.size(); ++i) std::copy(params[i].begin(), params[i].end(), m.param_tensors[i].f32());
  std::copy(ids.begin(), ids.end(), m.acts.ids.i32());
  std::copy(targets.begin(), targets.end(), m.acts.targets.i32());
  if (d.documents) {
    std::copy(doc_start.begin(), doc_start.end(), m.acts.doc_start.i32());
    int32_t* pos = d.llama ? m.acts.tok_pos.i32() : m.acts.pos_ids.i32();
    for (int64_t t = 0; t < d.T; ++t) pos[t] = int32_t(t) - doc_start[size_t(t)];
  }
  zero_grads(m);
  Result r;
  r.loss = model_forward(m, 1.f).loss_sum;
  model_backward(m, 0.f);
  for (const Tensor& g : m.grad_tensors) r.grads.emplace_back(g.f32(), g.f32() + g.numel());
  return r;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST_CASE("the sampler reads a Megatron document index: document starts and no target across a boundary",
          "[data][documents]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_docs_data_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<uint16_t> toks(400);  // token i is i: a window's first token is its stream position
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint16_t(i);
  const std::vector<int64_t> sizes = doc_sizes(400, {7, 1, 30, 3, 0, 12});
  e2e::write_megatron(dir / "docs", toks, sizes);
  std::vector<int64_t> starts;  // stream positions where documents 1.. begin
  for (int64_t at = 0, i = 0; i + 1 < int64_t(sizes.size()); ++i) starts.push_back(at += sizes[size_t(i)]);

  const int64_t T = 16;
  const BatchSampler s({(dir / "docs").string()}, "uint16", T, 512, 3, "train", "auto", ScanOptions{}, true);
  int checked = 0, boundaries = 0;
  for (int64_t index = 0; index < 40; ++index) {
    std::vector<int32_t> in(T), tg(T), ds(T);
    s.sequence(0, index, in.data(), tg.data(), ds.data());
    const int64_t start = in[0];
    for (int64_t t = 0; t < T; ++t) {
      int64_t want = 0;
      for (int64_t p : starts)
        if (p > start && p - start <= t) want = p - start;
      REQUIRE(ds[size_t(t)] == want);
      const bool crosses = std::count(starts.begin(), starts.end(), start + t + 1) > 0;
      REQUIRE((tg[size_t(t)] == -1) == crosses);
      boundaries += crosses;
      if (!crosses) REQUIRE(tg[size_t(t)] == int32_t(toks[size_t(start + t + 1)]));
    }
    ++checked;
  }
  std::printf("[documents] sampler: %d windows checked, %d targets across a boundary masked\n", checked, boundaries);
  REQUIRE(checked > 10);
  REQUIRE(boundaries > 10);

  // Raw tokens record no documents: refused at start-up, naming the file.
  std::ofstream(dir / "raw.bin", std::ios::binary).write(reinterpret_cast<const char*>(toks.data()), 800);
  std::string msg = "(nothing thrown)";
  try {
    BatchSampler({(dir / "raw.bin").string()}, "uint16", T, 512, 3, "train", "auto", ScanOptions{}, true);
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  std::printf("[message] %s\n", msg.c_str());
  CHECK_THAT(msg, Catch::Contains("data.documents: separate needs to know where documents start, but ") &&
                      Catch::Contains("raw.bin (data.train[0], raw uint16) records no documents") &&
                      Catch::Contains("scripts/prepare_corpus.py"));
  fs::remove_all(dir);
}

TEST_CASE("a packed row of documents: loss and gradients are the sums over its documents run alone",
          "[model][documents]") {
  for (const bool llama : {true, false}) {
    const int64_t T = 29;
    const std::vector<int64_t> starts = {0, 4, 5, 17, 26};  // documents of 4, 1, 12, 9 and 3 tokens
    std::vector<int32_t> ids(T), tg(T), ds(T);
    test::fill_ints(ids, 11, 0, 13);
    test::fill_ints(tg, 12, 0, 13);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s : starts)
        if (s <= t) ds[size_t(t)] = int32_t(s);
    for (int64_t s : starts)
      if (s > 0) tg[size_t(s - 1)] = -1;  // as the sampler marks them

    Model init;
    build_model(init, tiny(llama, T, true), 0.3, Device::CPU);
    init_parameters(init.params, init.param_tensors, 5);
    std::vector<std::vector<float>> params;
    for (const Tensor& p : init.param_tensors) params.emplace_back(p.f32(), p.f32() + p.numel());

    const Result packed = run(tiny(llama, T, true), params, ids, tg, ds);
    Result alone;
    alone.grads.resize(packed.grads.size());
    for (size_t i = 0; i < starts.size(); ++i) {
      const int64_t a = starts[i], b = i + 1 < starts.size() ? starts[i + 1] : T;
      const std::vector<int32_t> di(ids.begin() + a, ids.begin() + b), dt(tg.begin() + a, tg.begin() + b);
      const Result r = run(tiny(llama, b - a, false), params, di, dt, {});
      alone.loss += r.loss;
      for (size_t g = 0; g < r.grads.size(); ++g) {
        alone.grads[g].resize(r.grads[g].size(), 0.f);
        for (size_t j = 0; j < r.grads[g].size(); ++j) alone.grads[g][j] += r.grads[g][j];
      }
    }
    double worst = 0;
    std::string where;
    for (size_t g = 0; g < packed.grads.size(); ++g) {
      const double e = rel_l2(packed.grads[g], alone.grads[g]);
      if (e > worst) {
        worst = e;
        where = init.params[g].spec.name;
      }
    }
    const double loss_err = std::fabs(packed.loss - alone.loss) / std::fabs(alone.loss);
    std::printf("[documents] %s: packed loss %.6f vs documents alone %.6f (rel %.1e), gradients worst rel L2 %.1e (%s), "
                "tol 1e-5\n",
                llama ? "llama (RoPE)" : "gpt2 (learned positions)", packed.loss, alone.loss, loss_err, worst,
                where.c_str());
    CHECK(loss_err < 1e-5);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("separate documents under cp 2 x tp 2, pp 2 x dp 2 and cp 2 x ep 2 == one process", "[documents][e2e]") {
  const fs::path data = fs::temp_directory_path() / ("trainer_docs_e2e_" + std::to_string(::getpid()));
  fs::create_directories(data);
  std::vector<uint16_t> toks;
  {
    std::ifstream in("/usr/share/common-licenses/GPL-3", std::ios::binary);
    for (char c; in.get(c);) toks.push_back(uint16_t(static_cast<unsigned char>(c)));
  }
  // Document lengths around a chunk (cp 2 of 32 tokens: chunks of 8), some inside one.
  e2e::write_megatron(data / "docs", toks, doc_sizes(int64_t(toks.size()), {5, 19, 3, 40, 11, 1, 26}));
  const std::string prefix = (data / "docs").string();
  const std::string d = "train: [" + prefix + "], valid: [" + prefix + "], documents: separate";
  const char* llama = "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}";
  const char* moe =
      "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32, "
      "moe: {num_experts: 4, top_k: 2, d_ff: 32, aux_loss_coeff: 0.01}}";
  {
    const e2e::Setup s = e2e::make_setup("docs", "llama", llama, d);
    e2e::run_cases(s, "documents",
                   {{"docs cp2 x tp2 sp", 4, "--set parallel.cp=2 --set parallel.tp=2 --set parallel.sp=true"},
                    {"docs pp2 x dp2", 4, "--set parallel.pp=2"}},
                   {});
    fs::remove_all(s.dir);
  }
  {
    const e2e::Setup s = e2e::make_setup("docs", "moe", moe, d);
    e2e::run_cases(s, "documents", {{"docs moe cp2 x ep2", 2, "--set parallel.cp=2 --set parallel.ep=2"}}, {});
    fs::remove_all(s.dir);
  }
  fs::remove_all(data);
}
