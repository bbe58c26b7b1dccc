// The plan's communication per step (planner/comm_plan.h) against what real
// multi-process runs move (comm/timed_communicator.h counts every group's
// payload; the run prints it per step at its end): tp with sp, dp at ZeRO
// 0-3, pp (1F1B and interleaved), cp and ep, on tiny models. Equal to the
// byte, except the expert all-to-alls, whose sizes follow the routing: their
// mean over the ranks is exact (every rank dispatches its own N K rows, and
// what one receives another sent), one rank's share is not. The same runs
// hold the plan's weight, gradient and optimizer bytes to their allocation.
#include <catch2/catch.hpp>

#include <cstdio>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/mesh.h"
#include "config/config.h"
#include "e2e_util.h"
#include "pipeline/pipeline_plan.h"
#include "planner/comm_plan.h"
#include "planner/memory_plan.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// "comm measured per step, tp (2 ranks): all_reduce=1 ... | mean over ranks: all_reduce=1 ..."
struct Measured {
  std::map<std::string, std::map<std::string, std::string>> rank0, mean;
};

Measured read_measured(const std::string& log) {
  Measured m;
  std::ifstream in(log);
  std::string line;
  const std::string tag = "comm measured per step, ";
  while (std::getline(in, line)) {
    if (line.rfind(tag, 0) != 0) continue;
    const std::string label = line.substr(tag.size(), line.find(' ', tag.size()) - tag.size());
    const size_t bar = line.find(" | mean over ranks:");
    auto fill = [&](const std::string& part, std::map<std::string, std::string>& into) {
      std::istringstream words(part);
      std::string w;
      while (words >> w)
        if (auto eq = w.find('='); eq != std::string::npos) into[w.substr(0, eq)] = w.substr(eq + 1);
    };
    fill(line.substr(line.find(':') + 1, bar - line.find(':') - 1), m.rank0[label]);
    fill(line.substr(bar + 19), m.mean[label]);
  }
  return m;
}

struct Layout {
  const char* label;
  int world;
  std::vector<std::string> sets;
};

void check_layout(const fs::path& dir, const std::string& cfg, const Layout& l) {
  std::string extra, out;
  for (const std::string& s : l.sets) extra += " --set " + s;
  std::string name = l.label;
  for (char& ch : name)
    if (ch == ' ') ch = '_';
  const std::string run_dir = (dir / name).string();
  const int rc = e2e::run_by_hand(cfg, l.world, run_dir, &out, extra);
  INFO(l.label << "\n" << e2e::tail(out));
  REQUIRE(rc == 0);
  const Measured got = read_measured(run_dir + ".rank0.log");
  REQUIRE(!got.rank0.empty());

  const Config c = load_config_file(cfg, l.sets, l.world);
  const MeshShape mesh = resolve_mesh(c.parallel, l.world, 0);
  const int64_t m = microbatches_per_step(c, mesh.dp);
  const StepTraffic plan = step_traffic(c, DType::F32, mesh, Coords{}, m);
  int compared = 0, nonzero = 0;
  int64_t moved = 0;
  for (const auto& [label, kinds] : got.rank0) {
    const GroupTraffic* g = plan.find(label);
    for (int k = 0; k < kCommKinds; ++k) {
      const std::string kind = comm_kind_name(CommKind(k));
      const int64_t want = g ? g->payload.of(CommKind(k)) : 0;
      // Routing decides each rank's all-to-all rows; their mean is the plan's.
      const bool routed = label == "ep" && CommKind(k) == CommKind::AllToAll;
      const std::string measured = routed ? got.mean.at(label).at(kind) : kinds.at(kind);
      INFO(l.label << ": group " << label << " " << kind << (routed ? " (mean over ranks)" : " (rank 0)")
                   << " measured " << measured << " bytes per step, plan " << want << " (must be equal)");
      CHECK(measured == std::to_string(want));
      ++compared;
      if (want > 0) {
        ++nonzero;
        moved += want;
      }
    }
  }
  // Every group the plan says carries bytes was seen.
  for (const GroupTraffic& g : plan.groups) {
    int64_t total = 0;
    for (int64_t b : g.payload.bytes) total += b;
    INFO(l.label << ": the plan has " << total << " bytes per step on group " << g.label << " (" << g.size
                 << " ranks), the run reported " << (got.rank0.count(g.label) ? "it" : "nothing"));
    if (g.size > 1 && total > 0) CHECK(got.rank0.count(g.label) == 1);
  }
  CHECK(compared > 0);
  std::printf("[plan] %-40s %3d (group, kind) counts compared, %d non-zero (%lld B per step): measured == planned\n",
              l.label, compared, nonzero, (long long)moved);

  // The run's allocation equals the plan's ledger (the engine refuses to run
  // otherwise, and says so on this line when they agree).
  const MemoryPlan mem = plan_memory(c, DType::F32, mesh, Coords{}, c.parallel.zero_stage);
  const std::string line = "memory plan = allocation: parameters " + std::to_string(mem.param_bytes) + ", gradients " +
                           std::to_string(mem.grad_bytes) + ", optimizer " + std::to_string(mem.optimizer_bytes) +
                           " bytes";
  std::ifstream log(run_dir + ".rank0.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  INFO(l.label << ": rank 0 must print '" << line << "'");
  CHECK(text.find(line) != std::string::npos);
}

}  // namespace

TEST_CASE("the plan's communication bytes per step and memory equal a real run's: tp, sp, ZeRO 0-3, pp, cp, ep",
          "[plan][e2e]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_plan_traffic_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path tokens = e2e::write_byte_tokens(dir);
  const std::string cfg = (dir / "cfg.yaml").string();
  std::ofstream(cfg) << "run: {name: plan_traffic}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 4, n_heads: 4, n_kv_heads: 2, d_ff: 64, "
                        "max_seq_len: 32}\n"
                     << "train: {steps: 2, seq_len: 16, micro_batch_size: 2, global_batch_size: 8}\n"
                     << "data: {train: [" << tokens.string() << "]}\n"
                     << "log: {interval: 1, progress: lines}\n"
                     << "parallel: {timeout_s: 60}\n";
  const std::vector<Layout> layouts = {
      {"tp2 sp dp2 zero0", 4, {"parallel.tp=2", "parallel.sp=true", "parallel.zero_stage=0"}},
      {"tp2 dp2 zero1", 4, {"parallel.tp=2", "parallel.zero_stage=1"}},
      {"dp2 zero2", 2, {"parallel.zero_stage=2"}},
      {"tp2 sp dp2 zero3", 4, {"parallel.tp=2", "parallel.sp=true", "parallel.zero_stage=3"}},
      {"gpt2 tied pp2 1f1b dp2 zero1", 4,
       {"model.arch=gpt2", "model.n_kv_heads=0", "model.tie_embeddings=true", "parallel.pp=2", "parallel.zero_stage=1"}},
      {"pp2 interleaved tp2 sp", 4, {"parallel.pp=2", "parallel.pp_schedule=interleaved", "parallel.tp=2", "parallel.sp=true"}},
      {"cp2 dp2 zero1", 4, {"parallel.cp=2", "parallel.zero_stage=1"}},
      {"moe ep2 dp2 zero3", 2,
       {"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.d_ff=32", "parallel.ep=2", "parallel.zero_stage=3"}},
      // Recompute repeats forward collectives in backward (model/recompute.h).
      {"tp2 sp x cp2 recompute full", 4,
       {"parallel.tp=2", "parallel.sp=true", "parallel.cp=2", "train.recompute=full"}},
      {"tp2 sp dp2 zero3 recompute selective", 4,
       {"parallel.tp=2", "parallel.sp=true", "parallel.zero_stage=3", "train.recompute=selective"}},
      {"moe ep2 cp2 recompute full", 2,
       {"model.moe.num_experts=4", "model.moe.top_k=2", "model.moe.d_ff=32", "parallel.ep=2", "parallel.cp=2",
        "train.recompute=full"}},
  };
  for (const Layout& l : layouts) check_layout(dir, cfg, l);
  if (!std::getenv("TRAINER_KEEP_TEST_DIRS")) fs::remove_all(dir);
}
