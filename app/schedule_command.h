// `trainer schedule --config run.yaml [--world N] [--trace FILE [--forward-ms X]]`: the pipeline schedule a
// run would use, drawn per rank as a timeline, with the textbook bubble, the
// simulator's bubble under the stage cost model and each stage's peak
// activation memory. Nothing is launched.
#pragma once

#include <string>

#include "config/config.h"

namespace trainer {

// trace_path non-empty: the simulated timeline (stage costs, forward_ms per
// forward of the heaviest stage) is also written there as Chrome trace events.
std::string describe_schedule(const Config& c, int world_size, const std::string& trace_path = "",
                              double forward_ms = 1.0);

}  // namespace trainer
