// ZeRO's partition arithmetic (model/units.h, optim/zero_partition.h): the
// shards of all ranks cover every parameter element exactly once, never touch
// padding, start aligned, and have the same size on every rank.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "model/params.h"
#include "model/units.h"
#include "optim/zero.h"
#include "optim/zero_partition.h"
#include "model/transformer.h"
#include "comm/communicator.h"

#include <algorithm>
#include <memory>
#include "config/config.h"

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
        const auto units = unit_layout(d, params, shards, shards);
        const size_t elem = dtype_size(storage);
        INFO(model << " " << dtype_name(storage) << " shards " << shards);
        int64_t moe_layers = 0;
        for (int64_t i = 0; i < d.L; ++i) moe_layers += d.moe_layer(i);
        REQUIRE(units.size() == size_t(d.L + moe_layers) + 2);  // experts are a unit of their own
        std::vector<std::vector<int>> owner(params.size());
        for (size_t i = 0; i < params.size(); ++i) owner[i].assign(size_t(params[i].spec.numel()), 0);
        int64_t total_shard = -1;
        for (int r = 0; r < shards; ++r) {
          const auto off = shard_offsets(units, elem);
          if (total_shard < 0) total_shard = off.back();
          CHECK(off.back() == total_shard);  // same shard size on every rank
          for (const ZeroPiece& p : shard_pieces(units, params, elem, std::vector<int>(units.size(), r))) {
            const UnitLayout& u = units[size_t(p.unit)];
            CHECK(p.param >= u.first);
            CHECK(p.param < u.end);
            const int64_t s = shard_elems(u, elem);
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
  const auto units = unit_layout(d, params, 2, 2);
  const UnitIndex ux = unit_index(d, units);
  auto names = [&](int u) {
    std::string s;
    for (int i = units[size_t(u)].first; i < units[size_t(u)].end; ++i) s += params[size_t(i)].spec.name + " ";
    return s;
  };
  REQUIRE(ux.layers.size() == 2);
  REQUIRE(ux.layers[1].size() == 1);
  CHECK(names(ux.embedding) == "tok_embed.weight pos_embed.weight ");
  CHECK(names(ux.layers[1][0]).rfind("layers.1.attn_norm.weight", 0) == 0);
  CHECK(names(ux.layers[1][0]).find("layers.0") == std::string::npos);
  CHECK(names(ux.head) == "final_norm.weight final_norm.bias lm_head.weight ");
  // A MoE layer's experts are a unit of their own (reduced over the expert-data-parallel group).
  const ModelDims dm = dims_of("{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, moe: {num_experts: 4, every: 2}}",
                               DType::F32);
  const auto pm = parameter_list(dm, 0.02);
  const auto um = unit_layout(dm, pm, 2, 2);
  const UnitIndex xm = unit_index(dm, um);
  REQUIRE(xm.layers[0].size() == 1);
  REQUIRE(xm.layers[1].size() == 2);
  CHECK(um[size_t(xm.layers[1][1])].kind == UnitKind::Experts);
  CHECK(um[size_t(xm.layers[1][1])].group == GradGroup::Edp);
  CHECK(pm[size_t(um[size_t(xm.layers[1][1])].first)].spec.name == "layers.1.moe.w_gate");
}

// --- overlap: when the collectives are issued relative to the unit hooks ---

namespace {

// Pretends to be rank 0 of 2 and only records what is asked of it, so the
// order of collectives against forward/backward can be read off one log.
class RecordingComm final : public Communicator {
 public:
  explicit RecordingComm(std::vector<std::string>& log) : log_(log) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& members() const override { return members_; }
  Device device() const override { return Device::CPU; }
  void do_all_reduce(Tensor, ReduceOp) override { log_.push_back("all_reduce"); }
  void do_reduce_scatter(Tensor, Tensor) override { log_.push_back("reduce_scatter"); }
  void do_all_gather(Tensor, Tensor) override { log_.push_back("all_gather"); }
  void do_broadcast(Tensor, int) override {}
  void do_all_to_all(Tensor, Tensor) override {}
  void do_all_to_all_v(Tensor, const std::vector<int64_t>&, Tensor, const std::vector<int64_t>&) override {}
  void do_batch_send_recv(const std::vector<P2POp>&) override {}
  void do_barrier() override {}
  std::unique_ptr<Work> do_all_reduce_async(Tensor) override { return issue("all_reduce_async"); }
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor, Tensor) override { return issue("reduce_scatter_async"); }
  std::unique_ptr<Work> do_all_gather_async(Tensor, Tensor) override { return issue("all_gather_async"); }

 private:
  struct Logged final : Work {
    std::vector<std::string>& log;
    std::string what;
    Logged(std::vector<std::string>& l, std::string w) : log(l), what(std::move(w)) {}
    void wait() override { log.push_back("wait " + what); }
  };
  std::unique_ptr<Work> issue(const std::string& op) {
    const std::string id = op + " #" + std::to_string(++n_);
    log_.push_back(id);
    return std::make_unique<Logged>(log_, id);
  }
  std::vector<std::string>& log_;
  std::string name_ = "dp";
  std::vector<int> members_{0, 1};
  int n_ = 0;
};

class LoggingHooks final : public UnitHooks {
 public:
  LoggingHooks(UnitHooks& inner, std::vector<std::string>& log) : inner_(inner), log_(log) {}
  void forward_begin(Model& m, int u, const MicroBatch& mb) override {
    log_.push_back("forward " + std::to_string(u));
    inner_.forward_begin(m, u, mb);
  }
  void backward_begin(Model& m, int u, const MicroBatch& mb) override {
    log_.push_back("backward " + std::to_string(u));
    inner_.backward_begin(m, u, mb);
  }
  void backward_end(Model& m, int u, const MicroBatch& mb) override {
    log_.push_back("backward done " + std::to_string(u));  // the unit's gradients are complete
    inner_.backward_end(m, u, mb);
  }

 private:
  UnitHooks& inner_;
  std::vector<std::string>& log_;
};

size_t index_of(const std::vector<std::string>& log, const std::string& what, size_t from = 0) {
  for (size_t i = from; i < log.size(); ++i)
    if (log[i] == what) return i;
  return log.size();
}

std::vector<size_t> positions(const std::vector<std::string>& log, const std::string& prefix) {
  std::vector<size_t> at;
  for (size_t i = 0; i < log.size(); ++i)
    if (log[i].rfind(prefix, 0) == 0) at.push_back(i);
  return at;
}

}  // namespace

TEST_CASE("zero: reductions are issued as backward finishes each unit and waited after it", "[zero][overlap]") {
  const ModelDims d = dims_of("{arch: llama, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2}", DType::F32);
  const int units = int(d.L) + 2;
  for (int stage : {0, 1, 2, 3}) {
    for (int64_t micro : {1, 2}) {
      INFO("stage " << stage << ", " << micro << " micro-batches");
      std::vector<std::string> log;
      RecordingComm comm(log);
      Model m;
      build_model(m, single_plan(d, 0.02, stage, 2), Device::CPU, zero_model_storage(stage));
      ZeroOptimizer zero(m, stage, comm, comm, {});
      LoggingHooks hooks(zero, log);
      m.hooks = &hooks;
      zero.begin_step();
      for (int64_t mb = 0; mb < micro; ++mb) {
        log.push_back("micro-batch " + std::to_string(mb));
        const MicroBatch batch{mb, mb + 1 == micro};
        model_forward(m, 1.f, batch);
        model_backward(m, 0.f, batch);
      }
      log.push_back("finish");
      zero.finish_backward();
      const std::string op = stage == 0 ? "all_reduce_async" : "reduce_scatter_async";
      const std::vector<size_t> issued = positions(log, op);
      // Stages 0-1 synchronise on the last micro-batch only; 2-3 on every one.
      REQUIRE(issued.size() == size_t(units) * size_t(stage >= 2 ? micro : 1));
      const size_t last_mb = index_of(log, "micro-batch " + std::to_string(micro - 1));
      const size_t first_of_last = issued.size() - size_t(units);
      for (int k = 0; k < units; ++k) {
        const int u = units - 1 - k;  // backward order: head, layers from the top, embedding
        const size_t at = issued[first_of_last + size_t(k)];
        CHECK(at > last_mb);
        CHECK(at > index_of(log, "backward done " + std::to_string(u), last_mb));
        if (u > 0) CHECK(at < index_of(log, "backward " + std::to_string(u - 1), last_mb));  // overlaps the rest
      }
      // Each reduction is waited for only after backward went on with another
      // unit (its buffer is needed again) or at the end: it overlapped compute.
      CHECK(positions(log, "wait " + op).size() == issued.size());
      for (size_t at : issued) {
        const std::string id = log[at];
        const size_t w = index_of(log, "wait " + id, at);
        REQUIRE(w < log.size());
        bool overlapped = false;
        for (size_t i = at; i < w; ++i) overlapped |= log[i].rfind("backward ", 0) == 0 || log[i] == "finish";
        CHECK(overlapped);
      }
      if (stage == 3) {
        // The next unit's weights are requested before the current unit runs.
        for (int u = 1; u < units; ++u) {
          const size_t fwd_prev = index_of(log, "forward " + std::to_string(u - 1));
          const auto gathers = positions(log, "all_gather_async");
          const bool prefetched = std::any_of(gathers.begin(), gathers.end(), [&](size_t g) {
            return g > fwd_prev && g < index_of(log, "forward " + std::to_string(u));
          });
          CHECK(prefetched);
        }
      }
    }
  }
}

TEST_CASE("zero: stages 1-2 wait for each unit's updated weights at its next forward, not in the step", "[zero][overlap]") {
  const ModelDims d = dims_of("{arch: llama, d_model: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2}", DType::F32);
  const int units = int(d.L) + 2;
  for (int stage : {1, 2}) {
    for (bool overlap : {true, false}) {
      INFO("stage " << stage << (overlap ? ", overlap" : ", no overlap"));
      std::vector<std::string> log;
      RecordingComm comm(log);
      Model m;
      build_model(m, single_plan(d, 0.02, stage, 2), Device::CPU, zero_model_storage(stage));
      ZeroOptimizer zero(m, stage, comm, comm, {});
      zero.set_overlap(overlap);
      LoggingHooks hooks(zero, log);
      m.hooks = &hooks;
      const MicroBatch batch{0, true};
      zero.begin_step();
      model_forward(m, 1.f, batch);
      model_backward(m, 0.f, batch);
      zero.finish_backward();
      log.push_back("step");
      zero.step(1e-3, 1.0);
      log.push_back("stepped");
      zero.begin_step();
      model_forward(m, 1.f, batch);
      log.push_back("forward done");
      const size_t stepped = index_of(log, "stepped");
      std::vector<size_t> gathers;
      for (size_t at : positions(log, "all_gather_async"))
        if (at > index_of(log, "step")) gathers.push_back(at);
      REQUIRE(gathers.size() == size_t(units));  // one per unit, all issued inside step()
      for (int u = 0; u < units; ++u) {
        const size_t w = index_of(log, "wait " + log[gathers[size_t(u)]]);
        REQUIRE(w < log.size());
        CHECK(gathers[size_t(u)] < stepped);
        const size_t fwd = index_of(log, "forward " + std::to_string(u), stepped);
        REQUIRE(fwd < log.size());
        if (overlap) {
          // After the step, at the unit's own forward: the units before it computed meanwhile.
          CHECK(w > fwd);
          if (u + 1 < units) CHECK(w < index_of(log, "forward " + std::to_string(u + 1), stepped));
        } else {
          CHECK(w < stepped);
        }
      }
      // Whatever reads the whole weights outside a forward settles first.
      zero.step(1e-3, 1.0);
      zero.settle();
      size_t waits = 0;
      for (size_t at : positions(log, "all_gather_async")) waits += index_of(log, "wait " + log[at]) < log.size();
      CHECK(waits == positions(log, "all_gather_async").size());
    }
  }
}
