// `trainer schedule --config run.yaml [--world N]`: the pipeline schedule a
// run would use, drawn per rank as a timeline, with the textbook bubble, the
// simulator's bubble under the stage cost model and each stage's peak
// activation memory. Nothing is launched.
#pragma once

#include <string>

#include "config/config.h"

namespace trainer {

std::string describe_schedule(const Config& c, int world_size);

}  // namespace trainer
