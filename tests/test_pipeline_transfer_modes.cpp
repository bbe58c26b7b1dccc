// The simulator's transfer modes (pipeline/simulate.h TransferMode): every
// schedule of up to 8 stages and 16 micro-batches (gpipe, 1f1b, zb-h1, and
// interleaved with 2-4 chunks) runs without deadlock whether sends block or
// not and whether receives are posted one batch ahead or at their batch,
// with free and with costly messages; every rank computes its whole share;
// and posting receives early shortens the step once messages take time.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "pipeline/simulate.h"

using namespace trainer;

namespace {

std::string mode_name(const TransferMode& m) {
  return std::string(m.nonblocking_sends ? "non-blocking" : "blocking") + " sends, receives " +
         (m.early_receives ? "one batch ahead" : "at their batch") + ", transfer " + std::to_string(m.transfer);
}

struct Shape {
  ScheduleKind kind;
  int p, m, v;
};

std::vector<Shape> every_shape() {
  std::vector<Shape> out;
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      out.push_back({ScheduleKind::GPipe, p, m, 1});
      out.push_back({ScheduleKind::OneFOneB, p, m, 1});
      out.push_back({ScheduleKind::ZeroBubbleH1, p, m, 1});
      if (p >= 2 && m % p == 0)
        for (int v = 2; v <= 4; ++v) out.push_back({ScheduleKind::Interleaved, p, m, v});
    }
  return out;
}

}  // namespace

TEST_CASE("no schedule with p <= 8 and m <= 16 deadlocks in any transfer mode", "[pipeline]") {
  const std::vector<Shape> shapes = every_shape();
  int runs = 0;
  for (bool nonblocking : {true, false})
    for (bool early : {true, false})
      for (double transfer : {0.0, 0.5}) {
        TransferMode mode;
        mode.nonblocking_sends = nonblocking;
        mode.early_receives = early;
        mode.transfer = transfer;
        for (const Shape& sh : shapes) {
          const Schedule s = make_schedule(sh.kind, sh.p, sh.m, sh.v);
          const Simulation sim = simulate(s, {ActionCosts{}}, mode);
          INFO(schedule_name(sh.kind) << " p " << sh.p << " m " << sh.m << " v " << sh.v << ", " << mode_name(mode)
                                      << ": " << sim.error);
          REQUIRE(sim.ok);
          // F = BI = BW = 1, B = 2: 3 units per micro-batch and chunk.
          for (double b : sim.busy) REQUIRE(b == Approx(3.0 * sh.m * sh.v));
          // Messages that take time never make the step shorter.
          if (transfer > 0) {
            TransferMode free = mode;
            free.transfer = 0;
            REQUIRE(sim.step_time >= simulate(s, {ActionCosts{}}, free).step_time - 1e-9);
          }
          ++runs;
        }
      }
  std::printf("[pipeline] %d simulations (%zu schedules: gpipe, 1f1b, zb-h1, interleaved v 2..4; p <= 8, m <= 16; "
              "sends blocking or not, receives early or at their batch, messages free or half a forward): no deadlock\n",
              runs, shapes.size());
}

TEST_CASE("receives posted one batch ahead hide a message's time behind compute", "[pipeline]") {
  // With messages of half a forward, a receive posted when the rank reaches
  // its batch exposes the whole message; posted a batch ahead it arrives
  // during the compute in between.
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1, ScheduleKind::GPipe}) {
    const Schedule s = make_schedule(kind, 4, 8);
    TransferMode late, early;
    late.early_receives = false;
    late.transfer = early.transfer = 0.5;
    const Simulation a = simulate(s, {ActionCosts{}}, late), b = simulate(s, {ActionCosts{}}, early);
    REQUIRE(a.ok);
    REQUIRE(b.ok);
    std::printf("[pipeline] %s p 4 m 8, messages of 0.5 F: step %.1f with receives at their batch, %.1f posted a "
                "batch ahead (bubble %.3f -> %.3f)\n",
                schedule_name(kind), a.step_time, b.step_time, a.bubble(), b.bubble());
    CHECK(b.step_time < a.step_time);
  }
}
