// Stage-shaped execution in one process (model/transformer.h): a model cut
// into two pipeline stages by the sharding plan (stage 0: embedding and the
// first layers, stage 1: the other layers and the head), run piece by piece
// with four micro-batches in the sequential, GPipe and 1F1B orders, gives the
// gradients of the whole model run micro-batch after micro-batch. Activations
// travel between the stages as a pipeline would send them. Tolerance: 1e-5 of
// each gradient's largest element (the orders change only the order in which
// micro-batches are summed).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/device_memory.h"
#include "kernels/ops.h"
#include "model/sharding.h"
#include "comm/process_group.h"
#include "model/transformer.h"
#include "pipeline/executor.h"

using namespace trainer;

namespace {

constexpr int kMicro = 4;
constexpr uint64_t kSeed = 11;

ModelDims dims_of(const std::string& model) {
  const Config c = load_config_text("model: " + model + "\ndata: {train: [x.bin]}\n", "<test>", {});
  return make_dims(c, 2, 16);
}

struct Batch {
  std::vector<int32_t> ids, targets;
};

std::vector<Batch> batches(const ModelDims& d) {
  std::mt19937 g(5);
  std::uniform_int_distribution<int> tok(0, int(d.V) - 1);
  std::vector<Batch> out(kMicro);
  for (Batch& b : out) {
    b.ids.resize(size_t(d.N()));
    b.targets.resize(size_t(d.N()));
    for (auto& x : b.ids) x = tok(g);
    for (auto& x : b.targets) x = tok(g);
  }
  return out;
}

void build(Model& m, const ShardingPlan& plan) {
  build_model(m, plan, Device::CPU);
  for (size_t i = 0; i < m.params.size(); ++i) initial_values(m.params[i], kSeed, 0, m.params[i].spec.numel(), m.param_tensors[i].f32());
  zero_grads(m);
}

void load(Model& m, int64_t mb, const Batch& b) {
  Activations& a = acquire_activations(m, mb);
  std::copy(b.ids.begin(), b.ids.end(), a.ids.i32());
  std::copy(b.targets.begin(), b.targets.end(), a.targets.i32());
}

std::map<std::string, std::vector<float>> grads_of(const std::vector<const Model*>& models) {
  std::map<std::string, std::vector<float>> out;
  for (const Model* m : models)
    for (size_t i = 0; i < m->params.size(); ++i) {
      const Tensor& t = m->grad_tensors[i];
      auto& v = out[m->params[i].spec.name];
      if (v.empty()) v.assign(size_t(t.numel()), 0.f);
      for (int64_t k = 0; k < t.numel(); ++k) v[size_t(k)] += t.f32()[k];  // a tied table: both copies' sum
    }
  return out;
}

// Records which backward completes the gradients, per unit.
class LastFlags final : public UnitHooks {
 public:
  void forward_begin(Model&, int, const MicroBatch&) override {}
  void backward_begin(Model&, int, const MicroBatch&) override {}
  void backward_end(Model&, int unit, const MicroBatch& mb) override {
    if (mb.last) last_ends[unit].push_back(mb.id);
  }
  std::map<int, std::vector<int64_t>> last_ends;
};

struct Step {
  bool forward;
  int64_t mb;
};

std::vector<Step> sequential() {
  std::vector<Step> a;
  for (int64_t mb = 0; mb < kMicro; ++mb) a.insert(a.end(), {{true, mb}, {false, mb}});
  return a;
}
std::vector<Step> gpipe() {  // all forwards, then the backwards newest first
  std::vector<Step> a;
  for (int64_t mb = 0; mb < kMicro; ++mb) a.push_back({true, mb});
  for (int64_t mb = kMicro - 1; mb >= 0; --mb) a.push_back({false, mb});
  return a;
}
std::vector<Step> one_f_one_b(int stage, int stages) {  // warm-up, steady 1F1B, cool-down
  const int warm = std::min(stages - stage - 1, kMicro);
  std::vector<Step> a;
  int64_t f = 0, b = 0;
  for (; f < warm; ++f) a.push_back({true, f});
  while (f < kMicro) {
    a.push_back({true, f++});
    a.push_back({false, b++});
  }
  while (b < kMicro) a.push_back({false, b++});
  return a;
}

struct RunResult {
  std::map<std::string, std::vector<float>> grads;
  std::vector<double> losses;
  size_t max_slots[2] = {0, 0};
};

// Runs the two stages' action lists, each action as soon as what it needs
// has been "received" from the other stage.
RunResult run_pipeline(const ModelDims& d, const std::vector<Step> (&orders)[2], const std::vector<Batch>& data,
                       LastFlags* flags0) {
  MeshShape mesh;
  mesh.pp = 2;
  Model stage[2];
  for (int s = 0; s < 2; ++s) {
    Coords at;
    at.pp = s;
    build(stage[s], make_sharding_plan(d, 0.02, mesh, at, 0));
  }
  stage[0].hooks = flags0;
  const float ce = float(1.0 / double(kMicro * d.N()));
  const float aux = float(double(d.aux_coeff) / kMicro);
  std::map<int64_t, std::vector<float>> sent_act, sent_grad;  // stage 0 -> 1, 1 -> 0
  RunResult r;
  r.losses.assign(kMicro, 0);
  size_t next[2] = {0, 0};
  auto copy_out = [](Tensor t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); };
  auto copy_in = [](Tensor t, const std::vector<float>& v) { std::copy(v.begin(), v.end(), t.f32()); };
  // Slots must be reserved for the most micro-batches a stage holds at once.
  for (int s = 0; s < 2; ++s) {
    int64_t held = 0, most = 0;
    for (const Step& a : orders[s]) most = std::max(most, held += a.forward ? 1 : -1);
    reserve_activation_slots(stage[s], int(most));
    r.max_slots[s] = size_t(most);
  }
  while (next[0] < orders[0].size() || next[1] < orders[1].size()) {
    bool progressed = false;
    for (int s = 0; s < 2; ++s) {
      if (next[s] >= orders[s].size()) continue;
      const Step a = orders[s][next[s]];
      const bool last = a.mb == std::find_if(orders[s].rbegin(), orders[s].rend(), [](const Step& x) {
                                   return !x.forward;
                                 })->mb && !a.forward;
      const MicroBatch mb{a.mb, last};
      Model& m = stage[s];
      if (s == 0 && a.forward) {
        load(m, a.mb, data[size_t(a.mb)]);
        embedding_forward(m, mb);
        blocks_forward(m, mb, 0, m.dims.L);
        sent_act[a.mb] = copy_out(stage_output(m, a.mb));
      } else if (s == 1 && a.forward) {
        if (!sent_act.count(a.mb)) continue;  // not received yet
        load(m, a.mb, data[size_t(a.mb)]);
        copy_in(stage_input(m, a.mb), sent_act[a.mb]);
        blocks_forward(m, mb, 0, m.dims.L);
        r.losses[size_t(a.mb)] = head_forward(m, mb, ce).loss_sum;
      } else if (s == 1) {
        head_backward(m, mb);
        blocks_backward(m, mb, 0, m.dims.L, aux);
        sent_grad[a.mb] = copy_out(activation_grad(m, a.mb));
        release_activations(m, a.mb);
      } else {
        if (!sent_grad.count(a.mb)) continue;
        copy_in(activation_grad(m, a.mb), sent_grad[a.mb]);
        blocks_backward(m, mb, 0, m.dims.L, aux);
        embedding_backward(m, mb);
        release_activations(m, a.mb);
      }
      ++next[s];
      progressed = true;
    }
    REQUIRE(progressed);  // the orders must not deadlock
  }
  r.grads = grads_of({&stage[0], &stage[1]});
  return r;
}

}  // namespace

TEST_CASE("stage-shaped execution: two pipeline stages in 1F1B and GPipe order equal the sequential model",
          "[model][stages]") {
  const std::pair<const char*, std::string> models[] = {
      {"llama GQA", "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2}"},
      {"gpt2 tied", "{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, tie_embeddings: true}"},
      {"llama MoE", "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, moe: {num_experts: 4, top_k: 2}}"}};
  for (const auto& [label, model] : models) {
    const ModelDims d = dims_of(model);
    const std::vector<Batch> data = batches(d);
    // The reference: the whole model, one micro-batch after another.
    Model whole;
    build(whole, single_plan(d, 0.02));
    std::vector<double> ref_losses;
    for (int64_t mb = 0; mb < kMicro; ++mb) {
      load(whole, mb, data[size_t(mb)]);
      const MicroBatch batch{mb, mb + 1 == kMicro};
      ref_losses.push_back(model_forward(whole, float(1.0 / double(kMicro * d.N())), batch).loss_sum);
      model_backward(whole, float(double(d.aux_coeff) / kMicro), batch);
    }
    const auto ref = grads_of({&whole});

    struct Order {
      const char* name;
      std::vector<Step> stage[2];
    };
    const Order orders[] = {{"sequential", {sequential(), sequential()}},
                            {"GPipe", {gpipe(), gpipe()}},
                            {"1F1B", {one_f_one_b(0, 2), one_f_one_b(1, 2)}}};
    for (const Order& o : orders) {
      INFO(model << ", " << o.name);
      LastFlags flags;
      const RunResult r = run_pipeline(d, o.stage, data, &flags);
      double worst = 0;
      std::string worst_name;
      REQUIRE(r.grads.size() == ref.size());
      for (const auto& [name, g] : ref) {
        const auto& p = r.grads.at(name);
        REQUIRE(p.size() == g.size());
        double scale = 0, diff = 0;
        for (size_t k = 0; k < g.size(); ++k) {
          scale = std::max(scale, double(std::fabs(g[k])));
          diff = std::max(diff, double(std::fabs(p[k] - g[k])));
        }
        const double rel = scale > 0 ? diff / scale : diff;
        if (rel >= worst) {
          worst = rel;
          worst_name = name;
        }
      }
      double loss_diff = 0;
      for (int mb = 0; mb < kMicro; ++mb)
        loss_diff = std::max(loss_diff, std::fabs(r.losses[size_t(mb)] - ref_losses[size_t(mb)]) / ref_losses[size_t(mb)]);
      std::printf("[stages] %-9s %-10s slots %zu/%zu: max gradient error %.3e of its largest element (%s), loss %.3e "
                  "(tolerance 1e-5)\n",
                  label, o.name, r.max_slots[0], r.max_slots[1], worst, worst_name.c_str(),
                  loss_diff);
      CHECK(worst <= 1e-5);
      CHECK(loss_diff <= 1e-6);
      // Each unit of stage 0 heard "last" once, from its final backward.
      const int64_t final_b = o.stage[0].back().mb;
      for (const auto& [unit, ids] : flags.last_ends) CHECK(ids == std::vector<int64_t>{final_b});
      CHECK_FALSE(flags.last_ends.empty());
    }
    // 1F1B holds fewer activations than GPipe: p - s micro-batches on stage s.
    LastFlags unused;
    const Order& f1b1 = orders[2];
    CHECK(run_pipeline(d, f1b1.stage, data, &unused).max_slots[0] == 2);
  }
}

TEST_CASE("activation slots: a micro-batch beyond the reserved slots is refused, naming what is held", "[model][stages]") {
  const ModelDims d = dims_of("{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4}");
  Model m;
  build(m, single_plan(d, 0.02));
  acquire_activations(m, 0);
  try {
    acquire_activations(m, 1);
    FAIL("a second micro-batch got the only slot");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()).find("micro-batch 1") != std::string::npos);
    CHECK(std::string(e.what()).find("hold micro-batches 0") != std::string::npos);
  }
  reserve_activation_slots(m, 2);
  CHECK_NOTHROW(acquire_activations(m, 1));
  release_activations(m, 0);
  CHECK_NOTHROW(acquire_activations(m, 2));
}

TEST_CASE("split backward (BI then BW, weight halves deferred) gives the whole backward's gradients bit for bit",
          "[model][stages][pipeline]") {
  const std::pair<const char*, std::string> models[] = {
      {"llama GQA", "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2}"},
      {"gpt2 tied", "{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, tie_embeddings: true}"},
      {"llama MoE", "{arch: llama, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, moe: {num_experts: 4, top_k: 2}}"},
      {"gpt2 MoE", "{arch: gpt2, vocab_size: 64, d_model: 32, n_layers: 2, n_heads: 4, moe: {num_experts: 4, top_k: 2}}"}};
  SingleRankCommunicator pp("pp", 0, Device::CPU);
  for (const auto& [label, model] : models) {
    ModelDims d = dims_of(model);
    const std::vector<Batch> data = batches(d);
    const float ce = float(1.0 / double(kMicro * d.N()));
    const float aux = float(double(d.aux_coeff) / kMicro);
    auto loader = [&](Model& m, int64_t mb) { load(m, mb, data[size_t(mb)]); };
    // Every micro-batch forward, every input half, then every weight half:
    // each slot keeps its own output gradients for all of them.
    std::vector<trainer::Action> split;
    for (int mb = 0; mb < kMicro; ++mb) split.push_back({ActionKind::Forward, mb, 0, -1});
    for (int mb = 0; mb < kMicro; ++mb) split.push_back({ActionKind::BackwardInput, mb, 0, -1});
    for (int mb = 0; mb < kMicro; ++mb) split.push_back({ActionKind::BackwardWeight, mb, 0, -1});
    const Schedule whole_schedule = make_schedule(ScheduleKind::OneFOneB, 1, kMicro);

    Model whole, halves;
    build(whole, single_plan(d, 0.02));
    d.split_backward = true;
    build(halves, single_plan(d, 0.02));
    reserve_activation_slots(halves, kMicro);
    LastFlags flags;
    halves.hooks = &flags;
    const PipelineStepResult rw = run_pipeline_step({&whole}, pp, whole_schedule.ranks[0], ce, aux, loader);
    const PipelineStepResult rs = run_pipeline_step({&halves}, pp, split, ce, aux, loader);
    const auto gw = grads_of({&whole}), gs = grads_of({&halves});
    size_t differing = 0, compared = 0;
    for (const auto& [name, g] : gw) {
      const auto& h = gs.at(name);
      REQUIRE(h.size() == g.size());
      for (size_t k = 0; k < g.size(); ++k, ++compared) differing += g[k] != h[k];
    }
    std::printf("[stages] %-9s split backward: %zu of %zu gradient elements differ from the whole backward's "
                "(required: 0); loss %.6f vs %.6f\n",
                label, differing, compared, rs.loss_sum, rw.loss_sum);
    CHECK(differing == 0);
    CHECK(rs.loss_sum == rw.loss_sum);
    // The weight half of the last micro-batch ends every unit's backward.
    CHECK(flags.last_ends.size() == halves.units.size());
    for (const auto& [unit, ids] : flags.last_ends) CHECK(ids == std::vector<int64_t>{kMicro - 1});
    // Every slot was given back.
    for (const auto& slot : halves.slots) CHECK(slot->mb == -1);
  }
}
