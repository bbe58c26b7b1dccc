// Glue between the training state and checkpoint/: which tensors a rank saves
// (the elements of its data-parallel shard: fp32 weights, AdamW m and v) and
// how a loaded checkpoint is put back into the shards of the current layout.
//
// Every piece is saved against the parameter's real global shape: a rank
// that holds a whole parameter saves it whole, a ZeRO piece is a flat range
// of the whole (unsplit) tensor. Pieces are assembled for the layout being
// restored, so a checkpoint of DP 4 / ZeRO-2 resumes at DP 2 / ZeRO-1 or in
// one process.
#pragma once

#include <optional>
#include <vector>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/transformer.h"
#include "optim/zero.h"
#include "config/config.h"

namespace trainer {

// One model chunk's training state: a pipeline rank holds one chunk, or v
// under interleaving; a rank's share of a checkpoint is all of its chunks'.
struct ChunkState {
  Model* model = nullptr;
  ZeroOptimizer* opt = nullptr;
};

// Host copy of this rank's share of everything needed to continue.
Snapshot take_snapshot(const Config& cfg, const std::vector<ChunkState>& chunks, int64_t step, int64_t tokens,
                       int rank, int world_size);

// Restores weights, moments and the optimizer step counter of this rank's
// shard (collective under ZeRO 1-2: the weights are gathered afterwards).
// Throws std::runtime_error naming the tensor when the checkpoint lacks it,
// its dtype or shape differs from this model's, or the loaded pieces do not
// cover what this rank needs.
void restore_checkpoint(const LoadedCheckpoint& ck, const std::vector<ChunkState>& chunks);

// The saved pieces this rank needs to restore its own.
SliceFilter shard_filter(const std::vector<ChunkState>& chunks);

// The checkpoint to resume from (checkpoint.resume: auto | none | path),
// chosen by all ranks together: each rank reads only the saved pieces that
// overlap its own pieces (verifying the files it reads), and a candidate is
// taken only when it loaded on every rank; under "auto" the next one is tried
// otherwise, an explicit path fails on every rank. `host` is a group of all
// ranks for host tensors (a single-rank communicator in one process).
// A rollback (`healthy_only`) passes over checkpoints whose verdict is
// "unconfirmed" (no step had run on their state when they were written),
// except the one of step `trusted`, which this run resumed from and then
// stepped on healthily (-1: none).
std::optional<LoadedCheckpoint> load_resume_checkpoint(const std::string& root, const std::string& mode,
                                                       const std::vector<ChunkState>& chunks, Communicator& host,
                                                       bool lead, bool healthy_only = false, int64_t trusted = -1);

// "tp1.pp1.dp4.cp1.ep1.zero2"
std::string layout_string(const Config& c, int dp);

// Root directory for this run's checkpoints (checkpoint.dir or <run dir>/ckpt).
std::string checkpoint_root(const Config& cfg);

}  // namespace trainer
