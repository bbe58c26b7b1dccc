// The smoke test's checkpoint round trip (trainer/smoke.h): run at the end
// of a smoke run with the real layout, on every rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/launch.h"
#include "config/config.h"
#include "model/sharding.h"
#include "model/transformer.h"
#include "optim/zero.h"
#include "runtime/distributed_run.h"
#include "trainer/engine.h"
#include "trainer/stage_models.h"

namespace trainer {

// Saves (every rank its shard), loads back this rank's share and compares
// every byte, then restores into a fresh model and checks that the same
// batch gives the same loss bit for bit; the verdict (sum.roundtrip_*) is
// the same on all ranks.
void check_roundtrip(const Config& cfg, const std::vector<ShardingPlan>& plans, StageModels& models, int64_t step,
                     int64_t tokens, const std::string& root, const LaunchInfo& launch, DistributedRun& dist,
                     TrainSummary& sum);

}  // namespace trainer
