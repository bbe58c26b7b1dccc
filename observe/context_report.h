// The start-up line of a context-parallel run: the tokens each rank holds,
// its activation bytes, and the ring's traffic per attention layer.
#pragma once

#include <string>

#include "model/sharding.h"

namespace trainer {

std::string format_context_report(const ShardingPlan& plan, int64_t microbatches);

}  // namespace trainer
