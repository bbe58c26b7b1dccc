// The steps of a save that the single-process writer (checkpoint_writer.cpp)
// and the multi-rank protocol (checkpoint_group.cpp) share. Not part of the
// checkpoint API.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_internal.h"
#include "checkpoint/safetensors.h"

namespace trainer {
class Store;
}

namespace trainer::ckpt_detail {

// What one rank contributes to the manifest: its file and the pieces in it
// (tensor data not included).
struct RankReport {
  int rank = 0;
  std::string file;
  WrittenFile written;
  std::vector<ShardTensor> pieces;
};

// The ranks' pieces do not make up the tensors (a gap, an overlap, ranks
// disagreeing on a tensor): no single rank failed, the layout did.
struct PiecesMismatch : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The directories of one save.
struct SavePaths {
  std::filesystem::path root, partial, final_dir;
  std::string name;  // "step_00001000"
};

SavePaths save_paths(const std::string& root, int64_t step);
// Catches caller mistakes before anything touches the disk.
void validate_snapshot(const Snapshot& snap);
// Leaves an empty step_N.partial (creating the root as needed).
void prepare_partial(const SavePaths& p);
RankReport write_rank_file(const std::filesystem::path& partial, const Snapshot& snap);
// Every rank file is in place: manifest, rename, `latest`.
void finish(const SavePaths& p, const CheckpointMeta& meta, const std::vector<RankReport>& reports);
// Nothing of a failed save may look like a checkpoint.
void remove_partial(const SavePaths& p);
// Deletes leftovers of interrupted saves and deletions, and checkpoints
// beyond keep_last (each renamed to step_N.deleting before its files go).
void prune(const std::filesystem::path& root, int keep_last, const std::string& current);
void warn(const std::string& msg);  // "checkpoint: ..." on stderr

// One multi-rank save: where it meets in the store, and who is asking.
struct Rendezvous {
  Store& store;
  int rank = 0;
  int world = 1;
  double timeout_s = 0;
  std::string prefix;  // "ckpt/<root>/step_00001000/0/"
  PeerLiveness gone;   // CheckpointGroup::gone

  std::string ready() const { return prefix + "ready"; }
  std::string report(int r) const { return prefix + "report/" + std::to_string(r); }
  std::string outcome() const { return prefix + "outcome"; }
};

// Rank 0 of a group: prepares the directory, writes its own file, collects the
// others' reports and publishes only when all of them succeeded.
// `previous_prefix` holds the keys of this writer's previous save.
std::string save_as_rank0(const Rendezvous& rv, const SavePaths& p, int keep_last, Snapshot& snap,
                          std::string& previous_prefix);
// Any rank but 0; succeeds only if rank 0 then published the checkpoint.
std::string save_as_other_rank(const Rendezvous& rv, const SavePaths& p, Snapshot& snap);

}  // namespace trainer::ckpt_detail
