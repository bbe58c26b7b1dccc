// The simulator (pipeline/simulate.h) on a step of many micro-batches, from
// two shorter runs of the same schedule: past its warm-up every schedule is
// periodic, one micro-batch per period, so the step time, each rank's busy
// time and its activation slots are linear in m (constant slots for 1F1B,
// interleaved and ZB-H1, m slots for GPipe). `trainer plan --search` costs
// thousands of layouts with up to a thousand micro-batches each, which the
// full simulation cannot do in seconds. Exact below the cut-off; a test
// holds the extrapolation to the full simulation above it.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "pipeline/simulate.h"

namespace trainer {

// Micro-batches up to which the full simulation runs.
int64_t long_simulation_cutoff(int stages, int chunks);

// This run's schedule (parallel.pp_schedule, `stages` stages, m micro-batches)
// with these costs, transferring as planned_transfer_mode says; the result
// has no timeline. Throws what schedule_for throws.
// message_s: the time of one pipeline message (TransferMode::transfer).
Simulation simulate_long(const Config& c, int stages, int64_t microbatches,
                         const std::vector<ActionCosts>& costs = {ActionCosts{}}, double message_s = 0);

}  // namespace trainer
