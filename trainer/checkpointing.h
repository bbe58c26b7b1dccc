// Glue between the training state and checkpoint/: which tensors a rank saves
// (its model slice and optimizer slice) and how a loaded checkpoint is put
// back, slice by slice, into the arenas of the current layout.
#pragma once

#include <string>

#include "checkpoint/checkpoint.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "trainer/config.h"

namespace trainer {

// Host copy of everything needed to continue: weights, AdamW m and v, counters.
Snapshot take_snapshot(const Config& cfg, const Model& m, const AdamWState& opt, int64_t step,
                       int64_t tokens);

// Restores weights, moments and the optimizer step counter. Throws
// std::runtime_error naming the tensor when the checkpoint does not hold it or
// its global shape differs from this model's.
void restore_checkpoint(const LoadedCheckpoint& ck, Model& m, AdamWState& opt);

// Root directory for this run's checkpoints (checkpoint.dir or <run dir>/ckpt).
std::string checkpoint_root(const Config& cfg);

}  // namespace trainer
