// Activation recompute (model/recompute.h) in one process: with two
// micro-batches in flight (both forwards, then both backwards, so the shared
// copy of the dropped activations is overwritten before each backward needs
// it), selective and full recompute give the gradients and losses of keeping
// everything bit for bit, and the activation slot the run allocates shrinks
// to what the memory plan says.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/activations.h"
#include "model/transformer.h"
#include "planner/memory_plan.h"

using namespace trainer;

namespace {

constexpr int kMicro = 2;

Config config_of(const std::string& model, const std::string& recompute, int layers = 0) {
  return load_config_text("model: " + model + "\ndata: {train: [x.bin]}\ntrain: {micro_batch_size: 2, seq_len: 16, "
                          "recompute: " + recompute + ", recompute_layers: " + std::to_string(layers) + "}\n",
                          "<test>", {});
}

struct Result {
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  size_t slot_bytes = 0, scratch_bytes = 0;
};

Result run(const Config& c) {
  const ModelDims d = make_dims(c, c.train.micro_batch_size, c.train.seq_len);
  Model m;
  build_model(m, d, c.model.init_std, Device::CPU);
  for (size_t i = 0; i < m.params.size(); ++i)
    initial_values(m.params[i], 7, 0, m.params[i].spec.numel(), m.param_tensors[i].f32());
  zero_grads(m);
  reserve_activation_slots(m, kMicro);
  std::mt19937 g(3);
  std::uniform_int_distribution<int> tok(0, int(d.V) - 1);
  Result r;
  for (int mb = 0; mb < kMicro; ++mb) {
    Activations& a = acquire_activations(m, mb);
    for (int64_t n = 0; n < d.N(); ++n) {
      a.ids.i32()[n] = tok(g);
      a.targets.i32()[n] = tok(g);
    }
    MicroBatch b{mb, mb == kMicro - 1};
    embedding_forward(m, b);
    blocks_forward(m, b, 0, d.L);
    r.losses.push_back(head_forward(m, b, 1.f / float(d.N())).loss_sum);
  }
  for (int mb = kMicro - 1; mb >= 0; --mb) {
    MicroBatch b{mb, mb == 0};
    head_backward(m, b);
    blocks_backward(m, b, 0, d.L, d.aux_coeff);
    embedding_backward(m, b);
    release_activations(m, mb);
  }
  for (const Tensor& t : m.grad_tensors) r.grads.emplace_back(t.f32(), t.f32() + t.numel());
  r.slot_bytes = m.slots[0]->arena.capacity();
  r.scratch_bytes = m.scratch_arena.capacity();
  return r;
}

// Elements whose bits differ, over all gradients.
size_t differing(const Result& a, const Result& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.grads.size(); ++i)
    for (size_t k = 0; k < a.grads[i].size(); ++k)
      n += std::memcmp(&a.grads[i][k], &b.grads[i][k], sizeof(float)) != 0;
  return n;
}

size_t elements(const Result& r) {
  size_t n = 0;
  for (const auto& g : r.grads) n += g.size();
  return n;
}

}  // namespace

TEST_CASE("recompute selective and full: the gradients of keeping every activation, bit for bit", "[recompute]") {
  const char* const models[][2] = {
      {"llama GQA", "{arch: llama, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, d_ff: 64}"},
      {"gpt2 tied", "{arch: gpt2, vocab_size: 61, d_model: 32, n_layers: 2, n_heads: 4, tie_embeddings: true}"},
      {"llama MoE every 2nd layer", "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, "
                                    "moe: {num_experts: 4, top_k: 2, d_ff: 32, every: 2}}"},
      {"gpt2 MoE with capacity", "{arch: gpt2, d_model: 32, n_layers: 2, n_heads: 4, "
                                 "moe: {num_experts: 4, top_k: 2, d_ff: 32, capacity_factor: 0.75}}"},
  };
  for (const auto& model : models) {
    const Result none = run(config_of(model[1], "none"));
    for (const auto& [mode, layers] : std::vector<std::pair<std::string, int>>{{"selective", 0}, {"full", 0}, {"full", 1}}) {
      const Result r = run(config_of(model[1], mode, layers));
      const size_t diff = differing(none, r);
      std::printf("[recompute] %-26s %-9s layers %s: %zu of %zu gradient elements differ (want 0), loss %.9g vs "
                  "%.9g; slot %zu -> %zu B, scratch %zu -> %zu B\n",
                  model[0], mode.c_str(), layers ? std::to_string(layers).c_str() : "all", diff, elements(r),
                  r.losses[0], none.losses[0], none.slot_bytes, r.slot_bytes, none.scratch_bytes, r.scratch_bytes);
      INFO(model[0] << " recompute " << mode << " layers " << layers);
      CHECK(diff == 0);
      CHECK(r.losses == none.losses);
      CHECK(r.slot_bytes < none.slot_bytes);
    }
  }
}

TEST_CASE("recompute: the activation slots shrink as the memory plan says", "[recompute][memory]") {
  // A llama shape where the FFN dominates, as in real models (d_ff ~ 2.7 d).
  const std::string model = "{arch: llama, d_model: 64, n_layers: 4, n_heads: 4, d_ff: 172}";
  size_t prev = 0;
  for (const char* mode : {"none", "selective", "full"}) {
    const Config c = config_of(model, mode);
    const Result r = run(c);
    const MemoryPlan p = plan_memory(c);
    std::printf("[recompute] %-9s: activations planned %zu B, allocated %zu B per slot; workspace planned %zu B, "
                "allocated %zu B\n", mode, p.activation_bytes, r.slot_bytes, p.workspace_bytes, r.scratch_bytes);
    CHECK(p.activation_bytes == r.slot_bytes);  // one micro-batch in flight without a pipeline
    CHECK(p.workspace_bytes == r.scratch_bytes);
    if (prev) CHECK(r.slot_bytes < prev);
    prev = r.slot_bytes;
  }
}
