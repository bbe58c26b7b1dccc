// Pipeline schedules as data (pipeline/schedule.h) checked by the simulator
// (pipeline/simulate.h): every generated schedule of up to 8 stages and 16
// micro-batches is complete and deadlock-free; with unit costs the bubble of
// GPipe and 1F1B is (p - 1) / (m + p - 1) of the step; GPipe holds m
// micro-batches of activations at its peak and 1F1B p - r on rank r;
// broken schedules are rejected naming the rank and the action.
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "config/config.h"
#include "e2e_util.h"
#include "pipeline/simulate.h"
#include "planner/memory_plan.h"

using namespace trainer;

TEST_CASE("pipeline schedules: complete, deadlock-free, bubble (p-1)/(m+p-1), peak activations", "[pipeline]") {
  int checked = 0;
  double worst = 0;
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        const Schedule s = make_schedule(kind, p, m);
        ActionCosts unit;
        unit.forward = 1;
        unit.backward = 2;
        const Simulation sim = simulate(s, {unit});
        INFO(schedule_name(kind) << " p " << p << " m " << m << ": " << sim.error);
        REQUIRE(sim.ok);
        // Every rank computes m forwards and m backwards: 3m units.
        for (double b : sim.busy) CHECK(b == Approx(3.0 * m));
        const double want = theoretical_bubble(p, m);
        worst = std::max(worst, std::fabs(sim.bubble() - want));
        CHECK(sim.bubble() == Approx(want).margin(1e-12));
        CHECK(sim.step_time == Approx(3.0 * (m + p - 1)));
        for (int r = 0; r < p; ++r) {
          CHECK(sim.peak_in_flight[size_t(r)] == (kind == ScheduleKind::GPipe ? m : std::min(m, p - r)));
          // The executor's slots: one more where a batch sends one
          // micro-batch's gradient and receives the next one's input.
          CHECK(sim.peak_slots[size_t(r)] >= sim.peak_in_flight[size_t(r)]);
          CHECK(sim.peak_slots[size_t(r)] <= sim.peak_in_flight[size_t(r)] + 1);
        }
        ++checked;
      }
  std::printf("[pipeline] %d schedules (gpipe, 1f1b; p <= 8, m <= 16) simulated: bubble = (p-1)/(m+p-1) within %.1e; "
              "peak activations gpipe m, 1f1b min(m, p - r)\n",
              checked, worst);
  // The picture `trainer schedule` prints.
  const Simulation sim = simulate(make_schedule(ScheduleKind::OneFOneB, 4, 8));
  const std::string pic = format_timeline(sim);
  std::printf("[pipeline] 1f1b, p 4, m 8 (F = 1, B = 2), bubble %.3f:\n%s", sim.bubble(), pic.c_str());
  CHECK(pic.find("rank 3 | .| .| .|F0|B0|B0|F1|B1|B1|") != std::string::npos);
}

// The peak number of micro-batches between the start of their forward and
// the end of their backward, read off the timeline alone.
static int timeline_in_flight(const std::vector<TimedAction>& row) {
  int peak = 0;
  for (const TimedAction& at : row) {
    int n = 0;  // forwards begun by `at`'s start whose backward has not ended by then
    for (const TimedAction& f : row) {
      if (f.action.kind != ActionKind::Forward || f.start > at.start) continue;
      bool done = false;
      for (const TimedAction& b : row)
        done |= b.action.kind == ActionKind::Backward && b.action.mb == f.action.mb && b.end <= at.start;
      n += !done;
    }
    peak = std::max(peak, n);
  }
  return peak;
}

TEST_CASE("1F1B: the timeline's micro-batches in flight, the activation slots and the memory plan agree",
          "[pipeline][memory]") {
  // Stage s holds p - s micro-batches between forward and backward; its
  // slots are one more on every stage that receives (s > 0): the batch that
  // sends micro-batch b's input gradient receives b + p - s's input, whose
  // slot is taken before b's is given back (pipeline/schedule.h).
  for (int p = 2; p <= 8; ++p)
    for (int m = p; m <= 16; ++m) {
      const Simulation sim = simulate(make_schedule(ScheduleKind::OneFOneB, p, m));
      REQUIRE(sim.ok);
      for (int r = 0; r < p; ++r) {
        INFO("p " << p << " m " << m << " rank " << r);
        CHECK(timeline_in_flight(sim.timeline[size_t(r)]) == p - r);
        CHECK(sim.peak_in_flight[size_t(r)] == p - r);
        CHECK(sim.peak_slots[size_t(r)] == p - r + (r > 0 ? 1 : 0));
      }
    }
  // The memory plan allocates those slots and says how they come about.
  const Config c = load_config_file(std::string(TRAINER_SOURCE_DIR) + "/configs/tiny.yaml",
                                    {"parallel.pp=4", "model.n_layers=4", "train.micro_batch_size=2"}, 4);
  MeshShape mesh;
  mesh.pp = 4;
  const Simulation sim = simulate(make_schedule(ScheduleKind::OneFOneB, 4, 8));
  std::string slots, flight;
  for (int st = 0; st < 4; ++st) {
    Coords at;
    at.pp = st;
    const MemoryPlan plan = plan_memory(c, DType::F32, mesh, at, 0);
    const std::string text = describe_slots(plan);
    std::printf("[pipeline] 1f1b p 4 m 8, stage %d: %s\n", st, text.c_str());
    CHECK(plan.activation_slots == sim.peak_slots[size_t(st)]);
    CHECK(plan.in_flight == sim.peak_in_flight[size_t(st)]);
    if (st > 0)
      CHECK(text == std::to_string(5 - st) + " slots: " + std::to_string(4 - st) + " micro-batch" +
                        (st == 3 ? "" : "es") + " between forward and backward + 1 receiving its input while an "
                                               "earlier one's input gradient is sent");
    slots += std::to_string(plan.activation_slots);
    flight += std::to_string(plan.in_flight);
  }
  CHECK(slots == "4432");
  CHECK(flight == "4321");
}

TEST_CASE("interleaved 1F1B: deadlock-free, the bubble divided by the chunks, (p-1)/(v m + p-1)", "[pipeline]") {
  int checked = 0;
  for (int p = 2; p <= 8; ++p)
    for (int v = 2; v <= 4; ++v)
      for (int m = p; m <= 16; m += p) {
        const Schedule s = make_schedule(ScheduleKind::Interleaved, p, m, v);
        // A chunk is 1/v of a stage: forward 1/v, backward 2/v.
        ActionCosts chunk;
        chunk.forward = 1.0 / v;
        chunk.backward = 2.0 / v;
        const Simulation sim = simulate(s, {chunk});
        INFO("interleaved p " << p << " v " << v << " m " << m << ": " << sim.error);
        REQUIRE(sim.ok);
        CHECK(sim.bubble() == Approx(double(p - 1) / double(v * m + p - 1)).margin(1e-12));
        // Below 1F1B's at the same p and m.
        CHECK(sim.bubble() < theoretical_bubble(p, m));
        ++checked;
      }
  const Simulation sim = simulate(make_schedule(ScheduleKind::Interleaved, 4, 8, 2));
  std::printf("[pipeline] %d interleaved schedules (p 2..8, v 2..4, m a multiple of p up to 16): bubble = "
              "(p-1)/(v m + p-1); p 4, v 2, m 8 with F = 1, B = 2 per chunk:\n%s",
              checked, format_timeline(sim).c_str());
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::Interleaved, 4, 6, 2),
                    "interleaved 1F1B needs the micro-batches per step (6) to be a multiple of the pipeline stages (4)");
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::OneFOneB, 4, 8, 2), "the 1f1b schedule has one model chunk per rank");
}

TEST_CASE("ZB-H1: deadlock-free, bubble below 1F1B's, 1F1B's peak activations", "[pipeline]") {
  int checked = 0;
  double worst_ratio = 0;
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Schedule zb = make_schedule(ScheduleKind::ZeroBubbleH1, p, m);
      // The split halves of a backward: each as long as the forward.
      ActionCosts unit;
      const Simulation sim = simulate(zb, {unit});
      const Simulation base = simulate(make_schedule(ScheduleKind::OneFOneB, p, m), {unit});
      INFO("zb-h1 p " << p << " m " << m << ": " << sim.error);
      REQUIRE(sim.ok);
      REQUIRE(base.ok);
      for (double b : sim.busy) CHECK(b == Approx(3.0 * m));
      // Below 1F1B; with m >= p every rank idles (p - 1)(F + BI - BW) = p - 1
      // units, a third of 1F1B's 3 (p - 1): (p-1)/(3m + p-1) of the step.
      CHECK(sim.bubble() < base.bubble());
      if (m >= p) {
        CHECK(sim.step_time == Approx(3.0 * m + (p - 1)));
        CHECK(sim.bubble() == Approx(textbook_bubble(zb).value).margin(1e-12));
        worst_ratio = std::max(worst_ratio, sim.bubble() / base.bubble());
      }
      for (int r = 0; r < p; ++r) CHECK(sim.peak_in_flight[size_t(r)] <= std::min(m, p));
      ++checked;
    }
  const Simulation sim = simulate(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8));
  const Simulation base = simulate(make_schedule(ScheduleKind::OneFOneB, 4, 8));
  std::printf("[pipeline] %d zb-h1 schedules (p 2..8, m 1..16) simulated, all below 1f1b; with m >= p the bubble is "
              "(p-1)/(3m+p-1), at most %.3f of 1f1b's; p 4, m 8 (F = BI = BW = 1): bubble %.3f vs 1f1b %.3f:\n%s",
              checked, worst_ratio, sim.bubble(), base.bubble(), format_timeline(sim).c_str());
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::ZeroBubbleH1, 4, 8, 2), "the zb-h1 schedule has one model chunk per rank");
}

TEST_CASE("pipeline simulator: broken schedules are rejected naming the rank and the action", "[pipeline]") {
  auto rejected = [](Schedule s, const std::string& want) {
    const Simulation sim = simulate(s);
    INFO(sim.error);
    CHECK_FALSE(sim.ok);
    CHECK(sim.error.find(want) != std::string::npos);
  };
  const Schedule good = make_schedule(ScheduleKind::OneFOneB, 3, 4);
  REQUIRE(simulate(good).ok);
  {
    // A missing backward (one stage: no transfers to trip over first).
    Schedule s = make_schedule(ScheduleKind::OneFOneB, 1, 4);
    auto& acts = s.ranks[0];
    for (size_t i = 0; i < acts.size(); ++i)
      if (acts[i].kind == ActionKind::Backward && acts[i].mb == 2) {
        acts.erase(acts.begin() + long(i));
        break;
      }
    rejected(s, "rank 0: micro-batch 2 of chunk 0 has no complete backward");
  }
  {
    // Rank 1 receives micro-batch 1 before micro-batch 0, which rank 0 sends
    // first: messages between two ranks pair up in order.
    Schedule s = make_schedule(ScheduleKind::GPipe, 2, 2);
    for (Action& a : s.ranks[1])
      if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::Forward) a.mb = 1 - a.mb;
    rejected(s, "rank 0 action 1 send-act(mb 0, chunk 0) -> rank 1 meets rank 1 action 0 recv-act(mb 1, chunk 0) <- rank 0");
  }
  {
    // Both neighbours wait to receive before they send: a deadlock.
    Schedule s = make_schedule(ScheduleKind::GPipe, 2, 2);
    // Rank 0 first waits for a gradient that rank 1 can only send after
    // rank 0's activations arrive.
    auto& r0 = s.ranks[0];
    Action recv = {};
    for (size_t i = 0; i < r0.size(); ++i)
      if (r0[i].kind == ActionKind::RecvGradient) {
        recv = r0[i];
        r0.erase(r0.begin() + long(i));
        break;
      }
    // Keep the data dependency valid (recv before its backward) but move the
    // receive to the very front, and give micro-batch 0 its backward first.
    r0.insert(r0.begin(), recv);
    rejected(s, "the schedule deadlocks: rank 0 action 0 recv-grad(mb 0, chunk 0) <- rank 1 waits");
  }
  {
    // A send to the wrong rank.
    Schedule s = good;
    for (Action& a : s.ranks[0])
      if (a.kind == ActionKind::SendActivation) a.peer = 2;
    rejected(s, "rank 0 action 1 send-act(mb 0, chunk 0) -> rank 2: virtual stage 1 lives on rank 1");
  }
  {
    // A forward before its input arrived.
    Schedule s = good;
    auto& a = s.ranks[1];
    std::swap(a[0], a[1]);
    rejected(s, "rank 1 action 0 F(mb 0, chunk 0): runs before its input activation is received");
  }
  CHECK_THROWS_WITH(parse_schedule("zigzag"), "unknown pipeline schedule 'zigzag' (gpipe | 1f1b | interleaved | zb-h1)");
}

TEST_CASE("trainer schedule prints the timeline, both bubbles and the activation memory per stage", "[pipeline][cli]") {
  const std::string cfg = std::string(TRAINER_SOURCE_DIR) + "/configs/tiny.yaml";
  std::string out;
  FILE* p = ::popen((std::string(TRAINER_BIN) + " schedule --config " + cfg +
                     " --set parallel.pp=4 --set model.n_layers=8 --set train.micro_batch_size=2 2>&1")
                        .c_str(),
                    "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(e2e::tail(out));
  CHECK(status == 0);
  // 16 sequences in micro-batches of 2: m = 8 on 4 stages.
  CHECK(out.find("pipeline: 4 stages, 1f1b, 8 micro-batches per step") != std::string::npos);
  CHECK(out.find("bubble: (p-1)/(m+p-1) = 27.3% with equal stages") != std::string::npos);
  CHECK(out.find("rank 3 | .| .| .|F0|B0|B0|F1|") != std::string::npos);
  CHECK(out.find("stage 0: ") != std::string::npos);
  CHECK(out.find("peak activation memory per rank") != std::string::npos);
}

TEST_CASE("pipeline configuration mistakes exit 2 naming the keys", "[pipeline][cli][config]") {
  // configs/tiny.yaml: 2 layers, 16 sequences.
  e2e::expect_config_errors({
      {"--world 4 --set parallel.pp=4", "parallel.pp=4 needs at least one layer per stage, but model.n_layers=2"},
      {"--world 2 --set parallel.pp=2 --set parallel.pp_layers=[1,1,1]",
       "parallel.pp_layers=[1, 1, 1] has 3 entries, one per pipeline stage is needed (parallel.pp=2)"},
      {"--world 2 --set parallel.pp=2 --set parallel.pp_layers=[1,2]",
       "parallel.pp_layers=[1, 2] sums to 3 layers, model.n_layers=2"},
      {"--world 2 --set parallel.pp=2 --set parallel.pp_schedule=interleaved --set model.n_layers=4 "
       "--set train.micro_batch_size=3 --set train.global_batch_size=15",
       "parallel.pp_schedule=interleaved runs micro-batches in groups of parallel.pp=2, but a step has 5"},
      {"--world 3 --set parallel.pp=2", "parallel.tp x pp x cp = 1 x 2 x 1 = 2 does not divide the 3 processes"},
      {"--world 2 --set parallel.pp=2 --set parallel.zero_stage=2", "parallel.zero_stage=2 with parallel.pp=2"},
      {"--world 1 --set parallel.pp_schedule=zb-h1 --set parallel.zero_stage=3",
       "parallel.pp_schedule=zb-h1 with parallel.zero_stage=3"},
      {"--world 2 --set parallel.pp=2 --set parallel.pp_schedule=zigzag", "parallel.pp_schedule"},
  });
}
