// The smoke test's checkpoint round trip (verify/smoke.h): run at the end
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
#include "train/engine.h"
#include "train/stage_models.h"

namespace trainer {

// Saves (every rank its shard), loads back this rank's share and compares
// every byte, then restores into a fresh model and checks that the same
// batch gives the same loss bit for bit; the verdict (sum.roundtrip_*) is
// the same on all ranks.
// Its files go to <checkpoint root>/roundtrip.
void check_roundtrip(const FinishedRun& run, TrainSummary& sum);

}  // namespace trainer
