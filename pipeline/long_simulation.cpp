#include "pipeline/long_simulation.h"

#include <cmath>

#include "pipeline/pipeline_plan.h"

namespace trainer {

int64_t long_simulation_cutoff(int stages, int chunks) { return 4 * int64_t(stages) * chunks; }

Simulation simulate_long(const Config& c, int stages, int64_t m, const std::vector<ActionCosts>& costs, double message_s) {
  TransferMode mode = planned_transfer_mode(c);
  mode.transfer = message_s;
  const int chunks = pipeline_chunks(c);
  const int64_t cut = long_simulation_cutoff(stages, chunks);
  if (stages == 1 || m <= cut) {
    Simulation s = simulate(schedule_for(c, stages, m), costs, mode);
    s.timeline.clear();
    return s;
  }
  // Two runs in the periodic regime, m1 and m2 multiples of the stages
  // (interleaving runs micro-batches in groups of pp).
  const int64_t m1 = cut / 2, m2 = cut;
  const Simulation a = simulate(schedule_for(c, stages, m1), costs, mode);
  const Simulation b = simulate(schedule_for(c, stages, m2), costs, mode);
  if (!a.ok) return a;
  if (!b.ok) return b;
  const double k = double(m - m2) / double(m2 - m1);
  auto extend = [&](double x1, double x2) { return x2 + (x2 - x1) * k; };
  Simulation s = b;
  s.timeline.clear();
  s.step_time = extend(a.step_time, b.step_time);
  for (size_t r = 0; r < s.busy.size(); ++r) {
    s.busy[r] = extend(a.busy[r], b.busy[r]);
    s.peak_in_flight[r] = int(std::lround(extend(a.peak_in_flight[r], b.peak_in_flight[r])));
    s.peak_slots[r] = int(std::lround(extend(a.peak_slots[r], b.peak_slots[r])));
    for (size_t ch = 0; ch < s.peak_chunk_slots[r].size(); ++ch)
      s.peak_chunk_slots[r][ch] = int(std::lround(extend(a.peak_chunk_slots[r][ch], b.peak_chunk_slots[r][ch])));
  }
  return s;
}

}  // namespace trainer
