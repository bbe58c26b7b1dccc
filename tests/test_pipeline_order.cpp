// The simulator (pipeline/simulate.h) predicts what the executor
// (pipeline/executor.h) does. Ranks run a schedule over Gloo with every
// compute action made to take a known time (F = u, B = 2u, BI = BW = u: it
// sleeps as it starts, so the two cores' load hardly matters), and the
// order in which their actions start across ranks is the simulation's in
// the CPU executor's transfer mode (non-blocking sends, receives posted one
// batch ahead). Simulated starts are whole units; two actions on different
// ranks a unit or more apart in the simulation must start in that order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "model/params.h"
#include "model/sharding.h"
#include "model/transformer.h"
#include "pipeline/executor.h"
#include "pipeline/pipeline_plan.h"
#include "pipeline/simulate.h"
#include "rank_runner.h"

using namespace trainer;
using namespace trainer::test;

namespace {

constexpr double kUnit = 0.05;  // seconds per simulated unit

struct Case {
  ScheduleKind kind;
  int microbatches;
  int chunks = 1;
};

std::string label(const Case& c, int p) {
  std::string s = std::string(schedule_name(c.kind)) + " p " + std::to_string(p) + " m " + std::to_string(c.microbatches);
  if (c.chunks > 1) s += " v " + std::to_string(c.chunks);
  return s;
}

// One measured start: the action's index in its rank's compute order and
// its start in seconds of the shared monotonic clock.
struct Start {
  int rank;
  size_t index;
  double at;
};

// Runs the case on this rank; the note gets "index start" per compute
// action, in steady-clock microseconds (one clock for every process of a host).
std::string run_case(ProcessGroups& pg, const Case& c, const Schedule& s, const Simulation& sim) {
  Communicator& pp = pg.group(Axis::PP);
  const int p = pp.size(), r = pp.rank();
  const Config cfg = load_config_text(
      "model: {arch: llama, vocab_size: 64, d_model: 32, n_layers: " + std::to_string(p * c.chunks) +
          ", n_heads: 4, n_kv_heads: 2}\ndata: {train: [x.bin]}\n",
      "<test>", {});
  ModelDims g = make_dims(cfg, 1, 8);
  g.split_backward = splits_backward(c.kind);
  Coords at;
  at.pp = r;
  const std::vector<ShardingPlan> plans = chunk_plans(g, 0.02, pg.mesh(), at, 0, false,
                                                      even_stage_layers(g.L, p * c.chunks), c.chunks);
  std::vector<std::unique_ptr<Model>> models;
  std::vector<Model*> chunks;
  for (size_t k = 0; k < plans.size(); ++k) {
    models.push_back(std::make_unique<Model>());
    Model& m = *models.back();
    build_model(m, plans[k], Device::CPU);
    for (size_t i = 0; i < m.params.size(); ++i)
      initial_values(m.params[i], 3, 0, m.params[i].spec.numel(), m.param_tensors[i].f32());
    zero_grads(m);
    reserve_activation_slots(m, sim.peak_chunk_slots[size_t(r)][k]);
    chunks.push_back(&m);
  }
  auto load = [](Model& m, int64_t mb) {
    Activations& a = activations_of(m, mb);
    for (int64_t i = 0; i < m.dims.N(); ++i) {
      a.ids.i32()[i] = int32_t((mb * 7 + i) % m.dims.V);
      a.targets.i32()[i] = int32_t((mb * 5 + i + 1) % m.dims.V);
    }
  };
  PipelineStepOptions options;
  options.mode = TransferMode{};
  const ActionCosts cost;
  options.on_compute = [&](const Action& a) {
    std::this_thread::sleep_for(std::chrono::duration<double>(cost.of(a.kind) * kUnit));
  };
  pg.world().barrier();
  const double origin = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const PipelineStepResult res = run_pipeline_step(chunks, pp, s.ranks[size_t(r)], 1.f / float(g.N() * c.microbatches),
                                                   0.f, load, options);
  std::ostringstream out;
  for (size_t i = 0; i < res.timeline.size(); ++i) {
    const Action& want = sim.timeline[size_t(r)][i].action;
    CHILD_CHECK(res.timeline[i].action == want, "action " + std::to_string(i) + " is " + describe(res.timeline[i].action) +
                                                    ", the schedule's " + describe(want));
    out << i << ' ' << int64_t((origin + res.timeline[i].start) * 1e6) << ' ';
  }
  CHILD_CHECK(res.timeline.size() == sim.timeline[size_t(r)].size(), "ran " + std::to_string(res.timeline.size()) +
                                                                         " compute actions of " +
                                                                         std::to_string(sim.timeline[size_t(r)].size()));
  return out.str();
}

// Pairs of actions on different ranks, a unit or more apart in `sim`,
// that started in the other order.
int misordered(const Simulation& sim, const std::vector<Start>& measured, std::string* first) {
  int bad = 0;
  for (const Start& x : measured)
    for (const Start& y : measured) {
      if (x.rank == y.rank) continue;
      const TimedAction& sx = sim.timeline[size_t(x.rank)][x.index];
      const TimedAction& sy = sim.timeline[size_t(y.rank)][y.index];
      if (sx.start + 0.5 <= sy.start && x.at >= y.at) {
        if (bad++ == 0 && first)
          *first = "rank " + std::to_string(x.rank) + " " + describe(sx.action) + " (simulated at " +
                   std::to_string(sx.start) + ") started after rank " + std::to_string(y.rank) + " " +
                   describe(sy.action) + " (simulated at " + std::to_string(sy.start) + ")";
      }
    }
  return bad;
}

}  // namespace

TEST_CASE("the simulator's transfer mode reproduces the executor's order of actions across ranks",
          "[pipeline][serial]") {
  struct Group {
    int p;
    std::vector<Case> cases;
  };
  const std::vector<Group> groups = {
      {2, {{ScheduleKind::GPipe, 4}, {ScheduleKind::OneFOneB, 4}, {ScheduleKind::ZeroBubbleH1, 4},
           {ScheduleKind::Interleaved, 4, 2}}},
      {4, {{ScheduleKind::OneFOneB, 8}, {ScheduleKind::ZeroBubbleH1, 8}}},
  };
  int differs_blocking = 0;
  for (const Group& gr : groups) {
    Run run;
    run.world = gr.p;
    run.mesh.pp = gr.p;
    run.deadline_s = 60;
    const auto results = run_ranks(run, [&](ProcessGroups& pg, std::string& note) {
      for (const Case& c : gr.cases) {
        const Schedule s = make_schedule(c.kind, gr.p, c.microbatches, c.chunks);
        const Simulation sim = simulate(s, {ActionCosts{}}, TransferMode{});
        CHILD_CHECK(sim.ok, sim.error);
        note += run_case(pg, c, s, sim) + "|";
      }
    });
    require_all_passed(results);
    // Each rank's note: per case, "index start ..." then '|'.
    std::vector<std::vector<std::string>> notes(size_t(gr.p));
    for (const ChildResult& cr : results) {
      const size_t at = cr.report.find("note: ");
      REQUIRE(at != std::string::npos);
      std::stringstream in(cr.report.substr(at + 6));
      for (std::string part; std::getline(in, part, '|');) notes[size_t(cr.rank)].push_back(part);
    }
    for (size_t k = 0; k < gr.cases.size(); ++k) {
      const Case& c = gr.cases[k];
      const Schedule s = make_schedule(c.kind, gr.p, c.microbatches, c.chunks);
      const Simulation sim = simulate(s, {ActionCosts{}}, TransferMode{});
      std::vector<Start> measured;
      double origin = 1e300;
      for (int r = 0; r < gr.p; ++r) {
        REQUIRE(k < notes[size_t(r)].size());
        std::stringstream in(notes[size_t(r)][k]);
        size_t index;
        int64_t us;
        while (in >> index >> us) {
          const double start = double(us) * 1e-6;
          measured.push_back({r, index, start});
          origin = std::min(origin, start);
        }
      }
      // The largest gap between a measured start and the simulated one, in units.
      double drift = 0;
      for (const Start& m : measured)
        drift = std::max(drift, std::fabs((m.at - origin) / kUnit - sim.timeline[size_t(m.rank)][m.index].start));
      std::string first;
      const int bad = misordered(sim, measured, &first);
      // The blocking-send simulation (NCCL's, and overlap off) for contrast.
      TransferMode blocking;
      blocking.nonblocking_sends = blocking.early_receives = false;
      const Simulation other = simulate(s, {ActionCosts{}}, blocking);
      const int bad_other = other.ok ? misordered(other, measured, nullptr) : -1;
      differs_blocking += bad_other != 0;
      std::printf("[pipeline-order] %-22s %zu actions: %d pairs out of the simulated order (required 0), largest start "
                  "off the simulation %.2f units of %.0f ms; the blocking-send simulation orders %d pairs otherwise\n",
                  label(c, gr.p).c_str(), measured.size(), bad, drift, kUnit * 1e3, bad_other);
      INFO(label(c, gr.p) << ": " << first);
      CHECK(bad == 0);
    }
  }
  std::printf("[pipeline-order] %d of 6 cases tell the two transfer modes apart (required: at least 1)\n", differs_blocking);
  CHECK(differs_blocking > 0);
}
