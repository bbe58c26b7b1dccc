// The accounting of tensor parallelism against what the code does: a
// recording communicator counts the bytes of every tensor-parallel
// collective of whole training steps (forward, backward, the optimizer's
// norm sums) and they equal the plan's prediction (model/tp_traffic.h)
// exactly; the arenas a tp rank allocates are what the memory plan says,
// weights, gradients and optimizer state about 1/tp of one process, and
// sequence parallelism shrinks the activations.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "config/config.h"
#include "core/device_memory.h"
#include "model/sharding.h"
#include "model/tp_traffic.h"
#include "model/transformer.h"
#include "optim/zero.h"
#include "planner/memory_plan.h"

using namespace trainer;

namespace {

const char* const kModels[][2] = {
    // tp 2 splits the 2 kv heads, tp 4 replicates each on 2 ranks.
    {"llama GQA", "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64}"},
    {"gpt2 tied, vocabulary 61", "{arch: gpt2, vocab_size: 61, d_model: 32, n_layers: 2, n_heads: 4, tie_embeddings: true}"},
    {"MoE", "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, d_ff: 64, moe: {num_experts: 4, top_k: 2, d_ff: 32}}"},
};

// Loaded for one process, then given the layout (a loaded config is
// validated against the process count it runs with).
Config config_of(const char* model, int tp, bool sp) {
  Config c = load_config_text(std::string("model: ") + model + "\ndata: {train: [x.bin]}\n" +
                                  "train: {micro_batch_size: 2, seq_len: 16}\n",
                              "<test>", {});
  c.parallel.tp = tp;
  c.parallel.sp = sp;
  return c;
}

// Rank `rank` of a tensor-parallel group of `size` that moves nothing: it
// records each collective's payload (model/tp_traffic.h) and fills outputs
// with this rank's own data, so the numbers stay finite.
class TpRecorder final : public Communicator {
 public:
  TpRecorder(int rank, int size) : rank_(rank), size_(size) {
    for (int r = 0; r < size; ++r) members_.push_back(r);
  }
  std::map<std::string, int64_t> bytes, calls;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& members() const override { return members_; }
  Device device() const override { return Device::CPU; }
  void do_all_reduce(Tensor t, ReduceOp) override { note("all_reduce", t.nbytes()); }
  void do_reduce_scatter(Tensor out, Tensor in) override {
    note("reduce_scatter", in.nbytes());
    const char* own = static_cast<const char*>(in.data) + size_t(rank_) * out.nbytes();
    if (own != out.data) std::memmove(out.data, own, out.nbytes());
  }
  void do_all_gather(Tensor out, Tensor in) override {
    note("all_gather", out.nbytes());
    std::vector<char> mine(in.nbytes());
    std::memcpy(mine.data(), in.data, mine.size());
    for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(out.data) + size_t(r) * mine.size(), mine.data(), mine.size());
  }
  void do_broadcast(Tensor, int) override { fail("broadcast"); }
  void do_all_to_all(Tensor, Tensor) override { fail("all_to_all"); }
  void do_all_to_all_v(Tensor, const std::vector<int64_t>&, Tensor, const std::vector<int64_t>&) override {
    fail("all_to_all_v");
  }
  void do_batch_send_recv(const std::vector<P2POp>&) override { fail("batch_send_recv"); }
  void do_barrier() override {}
  std::unique_ptr<Work> do_all_reduce_async(Tensor) override { fail("all_reduce_async"); }
  std::unique_ptr<Work> do_reduce_scatter_async(Tensor, Tensor) override { fail("reduce_scatter_async"); }
  std::unique_ptr<Work> do_all_gather_async(Tensor, Tensor) override { fail("all_gather_async"); }

 private:
  void note(const std::string& op, size_t b) {
    bytes[op] += int64_t(b);
    calls[op] += 1;
  }
  [[noreturn]] void fail(const char* op) { throw std::logic_error(std::string("tp group: unexpected ") + op); }
  int rank_, size_;
  std::string name_ = "tp";
  std::vector<int> members_;
};

}  // namespace

TEST_CASE("tensor parallel: the bytes of every tp collective of a step equal the plan's prediction", "[tp][plan]") {
  int checked = 0;
  for (const auto& [label, model] : kModels)
    for (int tp : {2, 4})
      for (bool sp : {false, true})
        for (int stage : {0, 2})
        for (const char* recompute : {"none", "selective", "full"}) {
          Config c = config_of(model, tp, sp);
          c.train.recompute = recompute;
          const ModelDims g = make_dims(c, 2, 16);
          MeshShape mesh;
          mesh.tp = tp;
          Coords at;
          at.tp = tp - 1;  // the last rank: padding rows under a vocabulary tp does not divide
          const ShardingPlan plan = make_sharding_plan(g, 0.02, mesh, at, stage, sp);
          Model m;
          build_model(m, plan, Device::CPU, zero_model_storage(stage));
          TpRecorder rec(at.tp, tp);
          m.tp = &rec;
          SingleRankCommunicator solo("dp", 0, Device::CPU);
          ZeroOptimizer zero(m, stage, solo, solo, {});
          m.hooks = &zero;
          zero.load([&](const std::string&, int p, int64_t b, int64_t n, float* dst) {
            initial_values(m.params[size_t(p)], 7, b, n, dst);
          }, false);
          constexpr int64_t kMicro = 2;
          std::mt19937 rng(3);
          zero.begin_step();
          for (int64_t mb = 0; mb < kMicro; ++mb) {
            Activations& a = acquire_activations(m, mb);
            std::vector<int32_t> ids(size_t(g.N())), targets(size_t(g.N()));
            for (auto* v : {&ids, &targets})
              for (int32_t& x : *v) x = int32_t(rng() % uint32_t(g.V));
            write_from_host(a.ids, ids.data());
            write_from_host(a.targets, targets.data());
            const MicroBatch micro{mb, mb + 1 == kMicro};
            model_forward(m, 1.f / float(g.N() * kMicro), micro);
            model_backward(m, 0.01f, micro);
          }
          zero.finish_backward();
          const TpTraffic want = tp_traffic(plan, kMicro);
          INFO(label << ", tp " << tp << (sp ? " sp" : "") << ", ZeRO " << stage << ", recompute " << recompute << "\n"
                     << format_tp_traffic(want));
          int64_t want_calls[3] = {0, 0, 0};
          for (const TpCollective& tc : want.collectives) want_calls[int(tc.op)] += tc.calls;
          for (TpOp op : {TpOp::AllReduce, TpOp::AllGather, TpOp::ReduceScatter}) {
            const std::string name = tp_op_name(op);
            INFO(name << ": recorded " << rec.bytes[name] << " B in " << rec.calls[name] << " calls, planned "
                      << want.payload(op) << " B in " << want_calls[int(op)]);
            CHECK(rec.bytes[name] == want.payload(op));
            CHECK(rec.calls[name] == want_calls[int(op)]);
          }
          // sp trades each all-reduce for an all-gather + reduce-scatter pair.
          CHECK((rec.calls["reduce_scatter"] > 0) == sp);
          ++checked;
          if (checked == 1 || (tp == 4 && sp && stage == 2))
            std::printf("[tp] %s, tp %d%s, ZeRO %d, recompute %s: all_reduce %lld B, all_gather %lld B, "
                        "reduce_scatter %lld B per step, as planned\n",
                        label, tp, sp ? " sp" : "", stage, recompute, (long long)rec.bytes["all_reduce"],
                        (long long)rec.bytes["all_gather"], (long long)rec.bytes["reduce_scatter"]);
        }
  CHECK(checked == 72);
}

TEST_CASE("tensor parallel: a tp rank allocates what the plan says, about 1/tp of one process", "[tp][memory]") {
  for (const auto& [label, model] : kModels) {
    const MemoryPlan one = plan_memory(config_of(model, 1, false), DType::F32, 1, 1);
    for (int tp : {2, 4})
      for (bool sp : {false, true})
        for (int stage : {0, 1, 3}) {
          const Config c = config_of(model, tp, sp);
          MeshShape mesh;
          mesh.tp = tp;
          Coords at;
          at.tp = 1;
          const MemoryPlan p = plan_memory(c, DType::F32, mesh, at, stage);
          const ShardingPlan plan = make_sharding_plan(make_dims(c, 2, 16), 0.02, mesh, at, stage, sp);
          Model m;
          build_model(m, plan, Device::CPU, zero_model_storage(stage));
          SingleRankCommunicator solo("dp", 0, Device::CPU);
          ZeroOptimizer zero(m, stage, solo, solo, {});
          INFO(label << ", tp " << tp << (sp ? " sp" : "") << ", ZeRO " << stage);
          // What this rank holds, arena by arena (one data-parallel rank: ZeRO
          // shards nothing, stage 3 keeps its one shard plus unit buffers).
          if (stage < 3) CHECK(m.param_arena.capacity() == p.param_bytes);
          if (stage < 2) CHECK(m.grad_arena.capacity() == p.grad_bytes);
          CHECK(zero.optimizer_bytes() == p.optimizer_bytes);
          CHECK(m.slots.front()->arena.capacity() == p.activation_bytes);
          CHECK(m.scratch_arena.capacity() == p.workspace_bytes);
          if (stage == 1) {
            const double wr = double(one.param_bytes) / double(p.param_bytes),
                         orr = double(one.optimizer_bytes) / double(p.optimizer_bytes);
            INFO("weights 1/" << wr << ", optimizer 1/" << orr);
            // Norms (and row biases, the router) are whole on every tp rank.
            CHECK(wr > 0.75 * tp);
            CHECK(wr <= tp * 1.0001);
            CHECK(orr > 0.75 * tp);
            if (tp == 2)
              std::printf("[tp] %s, tp 2%s: weights %zu B (1 process %zu B), optimizer %zu B (%zu B), activations %zu B "
                          "(%zu B)\n",
                          label, sp ? " sp" : "", p.param_bytes, one.param_bytes, p.optimizer_bytes,
                          one.optimizer_bytes, p.activation_bytes, one.activation_bytes);
          }
        }
    // Sequence parallelism shrinks the saved activations.
    MeshShape mesh;
    mesh.tp = 2;
    const MemoryPlan plain = plan_memory(config_of(model, 2, false), DType::F32, mesh, Coords{}, 1);
    const MemoryPlan seq = plan_memory(config_of(model, 2, true), DType::F32, mesh, Coords{}, 1);
    INFO(label << ": activations " << plain.activation_bytes << " B without sp, " << seq.activation_bytes << " B with");
    CHECK(seq.activation_bytes < plain.activation_bytes);
    CHECK(plain.activation_bytes < one.activation_bytes);
  }
}
