// Whose checkpoints a run may resume and write among. A run's identity is
// its seed, its model (every model.* key but how the weights were first
// filled: init_from, init_std) and its training data (each data.train
// entry's weight and each file's size and sampled content,
// data/content_sample.h; not the paths, so moving a dataset keeps it). It is
// recorded in every manifest (checkpoint/checkpoint.h RunIdentity), so a run
// pointed by mistake at another run's checkpoint directory is stopped before
// it resumes the other's state or rotates its checkpoints away.
//
// A checkpoint is this run's when its id is ours or in our lineage: the ids
// of runs this one continued on purpose (checkpoint.load_foreign: true, or a
// checkpoint path in checkpoint.resume), carried from manifest to manifest.
// One without an identity (written before they were recorded) is unknown
// and never called foreign.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "data/batch_sampler.h"

namespace trainer {

RunIdentity run_identity(const Config& cfg, const BatchSampler& train);

// How a saved checkpoint's run differs from ours ("seed 7 (this run: 1); the
// training data"), or "" when it is ours or unknown.
std::string foreign_difference(const RunIdentity& ours, uint64_t our_seed, const CheckpointMeta& saved);

// Adds the run behind `saved` to ours' lineage (and its own lineage): this
// run continues it from here on. Keeps the newest kMaxLineage ids.
inline constexpr size_t kMaxLineage = 16;
void adopt_lineage(RunIdentity& ours, const RunIdentity& saved);

// The start-up check of checkpoint.dir: every complete checkpoint in `root`
// must be this run's, or checkpoint.load_foreign must say to take them
// (their runs then join our lineage). Throws ConfigError naming up to three
// and how they differ, and what to do. `notes` gets a line per foreign
// checkpoint accepted under load_foreign.
void check_checkpoint_root(const Config& cfg, const std::string& root, RunIdentity& ours,
                           std::vector<std::string>* notes);

}  // namespace trainer
