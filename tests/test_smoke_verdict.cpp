// The smoke test's verdict (verify/smoke.h judge_smoke) on synthetic runs:
// the throughput check tells a real slowdown from a few ms of OS jitter.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "train/engine.h"
#include "verify/smoke.h"

using namespace trainer;

namespace {

// 40 healthy steps: the first half at `first` ms, the second at `second`.
TrainSummary run_of(double first, double second) {
  TrainSummary s;
  for (int i = 0; i < 40; ++i) {
    s.losses.push_back(5.0 - 0.05 * i);
    s.grad_norms.push_back(1.0);
    s.step_ms.push_back(i < 20 ? first : second);
  }
  s.planned_bytes = 1 << 20;
  s.roundtrip_checked = s.roundtrip_ok = true;
  return s;
}

SmokeCheck throughput(const TrainSummary& s) {
  for (const SmokeCheck& c : judge_smoke(s, 0))
    if (c.name == "throughput stable") return c;
  FAIL("no throughput check in the verdict");
  return {};
}

}  // namespace

TEST_CASE("smoke verdict: throughput stable passes a steady run and jitter of a few ms, fails a slowdown",
          "[smoke]") {
  const struct {
    double first, second;
    bool pass;
  } cases[] = {
      {200, 210, true},   // steady
      {200, 400, false},  // twice as slow: a trend
      {200, 100, false},  // twice as fast: the first half was held back
      {2.4, 5.8, true},   // a 2-ms model whose second half met the OS's writeback (CI, 2 cores)
      {2.4, 12.0, false}, // the same model, 10 ms slower a step: beyond jitter
  };
  for (const auto& c : cases) {
    const SmokeCheck v = throughput(run_of(c.first, c.second));
    std::printf("[smoke] %.1f -> %.1f ms: %s (%s)\n", c.first, c.second, v.pass ? "PASS" : "FAIL", v.detail.c_str());
    CHECK(v.pass == c.pass);
  }
}
