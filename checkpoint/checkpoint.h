// Sharded checkpoint directories (docs/ARCHITECTURE.md "Checkpoint life cycle"):
//
//   <root>/step_00001000/manifest.json      step, tokens, config, layout, RNG,
//                                           every tensor's global shape, dtype,
//                                           which file holds which piece of it
//                                           (box + flat range, slice.h), checksums
//   <root>/step_00001000/rank_00000.safetensors   one file per rank
//   <root>/latest                            text file: "step_00001000\n"
//
// Saving: the caller hands a host snapshot (copied synchronously); a
// background thread writes it into step_N.partial/, fsyncs, renames it to
// step_N/ once every file is complete, then replaces `latest` atomically and
// removes checkpoints beyond keep_last (each renamed to step_N.deleting
// first). A directory without a complete manifest, whose manifest does not
// match its own checksum, or whose files do not match the manifest's sizes
// and checksums, is never loaded.
//
// Several ranks (a CheckpointGroup): every rank's writer saves the same steps,
// each with its own snapshot, and they meet in the rendezvous store under
// ckpt/<root>/step_N/<k>/ (k counts earlier saves of that step by this writer).
// Rank 0 recreates step_N.partial/ and sets "ready"; every rank then writes
// its rank_XXXXX.safetensors there (fsynced) and publishes a report (file
// size, CRC32C, its pieces) or its error under "report/<rank>". Rank 0 waits
// for all reports (timeout_s), and publishes (manifest, rename, `latest`,
// pruning) only when every rank succeeded and the pieces hold every element
// of each tensor exactly once; otherwise it removes the .partial directory. Its verdict
// ("done" / "failed: why") goes to "outcome", which the other ranks wait for,
// so a save throws on every rank unless the checkpoint was published, and the
// message names the rank that failed or never reported. The root must be one
// directory shared by all ranks (a shared filesystem across nodes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "checkpoint/slice.h"
#include "core/tensor.h"

namespace trainer {

// One piece of a global tensor that a rank saves (or a reader loaded): which
// elements (`slice`: the real global shape, a box of it, optionally a flat
// range of the box) and their bytes.
struct ShardTensor {
  std::string name;                 // "model/<param>", "optim/m/<param>", "optim/v/<param>"
  DType dtype = DType::F32;
  SliceSpec slice;
  std::vector<char> data;           // slice.numel() elements in the box's row-major order
};

// Which run wrote a checkpoint (train/run_identity.h computes it): hex
// fingerprints of the model's architecture and of the training data, and
// `id` over those and the seed. `lineage` holds the ids of the runs this one
// continued on purpose (checkpoint.load_foreign), so their checkpoints in the
// same root still count as its own. All empty in manifests written before
// identities were recorded: unknown, and never judged foreign.
struct RunIdentity {
  std::string id, model, data;
  std::vector<std::string> lineage;
  bool known() const { return !id.empty(); }
};

// What the step policy (train/step_policy.h) knew of the saved state.
// "healthy": the step run on this state was judged healthy before it was
// written (an interval's save); "unconfirmed": no step has run on it yet (the
// last step's or a preemption's save); "" in older manifests.
inline constexpr const char* kVerdictHealthy = "healthy";
inline constexpr const char* kVerdictUnconfirmed = "unconfirmed";

struct CheckpointMeta {
  int64_t step = 0;                 // optimizer steps completed
  int64_t tokens = 0;               // tokens consumed
  uint64_t seed = 0;
  int64_t optimizer_step = 0;       // AdamW bias-correction counter
  std::string config_yaml;          // resolved configuration at save time
  int world_size = 1;               // parallel layout at save time
  int nodes = 0;                    // hosts the ranks ran on; 0: not recorded (older manifests, one process)
  std::string layout;               // e.g. "tp1.pp1.dp1.cp1.ep1.zero0"
  // Steps of data skipped by rollbacks (train/step_policy.h): step s reads
  // the batch of data step s + data_offset. Absent in older manifests: 0.
  int64_t data_offset = 0;
  RunIdentity identity;
  std::string verdict;              // kVerdictHealthy, kVerdictUnconfirmed or "" (unknown)
};

struct Snapshot {
  CheckpointMeta meta;
  int rank = 0;
  std::vector<ShardTensor> tensors;
};

// Name of the directory for a step: "step_00001000".
std::string checkpoint_dir_name(int64_t step);

class Store;  // comm/store.h

// The ranks that save one checkpoint together. `store` (not owned) must
// outlive the writer; it may be shared with other users (keys live under
// "ckpt/"), but one group writer per key space: give a second one a
// PrefixStore. timeout_s bounds each wait for another rank (rank 0 for the
// others' reports, the others for rank 0's directory; its verdict may take
// twice as long, since rank 0 may itself wait timeout_s for a slow rank).
//
// `gone` makes the waits watch the ranks they wait on: asked about once a
// second with those ranks, it names the ones that are dead or stopped (the
// watchdog's heartbeats, runtime/watchdog.h) or returns "" (all alive, or it
// cannot tell), and a wait on a gone rank fails at once naming it instead of
// waiting out timeout_s. Unset: only timeout_s ends a wait.
using PeerLiveness = std::function<std::string(const std::vector<int>& ranks)>;
struct CheckpointGroup {
  Store* store = nullptr;
  int rank = 0;
  int world_size = 1;
  double timeout_s = 600;
  PeerLiveness gone;
};

class CheckpointWriter {
 public:
  // async=false writes inside save() before returning. A single process:
  // snapshots must have world_size 1.
  CheckpointWriter(std::string root, int keep_last, bool async);
  // One rank of `group`: every rank constructs a writer with the same root
  // and calls save() for the same steps, with snap.rank = group.rank and
  // snap.meta.world_size = group.world_size. keep_last matters on rank 0
  // only. Throws std::invalid_argument for an inconsistent group.
  CheckpointWriter(std::string root, int keep_last, bool async, CheckpointGroup group);
  ~CheckpointWriter();  // waits for an in-flight write
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Takes ownership of the snapshot. Waits for the previous write first (one
  // in flight at a time). Errors of a background write are rethrown by the
  // next save() or wait(). With a group, a save completes on rank 0 when the
  // checkpoint is published, on the others when rank 0 announced that.
  void save(Snapshot snap);
  void wait();
  bool busy() const;
  // Directory of the last completed (published) save, "" if none.
  std::string last_completed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct LoadedCheckpoint {
  std::string dir;
  CheckpointMeta meta;
  std::vector<ShardTensor> tensors;  // the loaded pieces of every rank file, verified
};

// Which saved pieces a rank needs (the tensor's name and the piece as the
// manifest records it); an empty filter: all of them.
using SliceFilter = std::function<bool(const std::string& name, const SliceSpec& saved)>;

// The filter of a rank that needs `wanted` (tensor name, piece of its own
// layout): it takes a saved piece only when it shares an element with a
// wanted piece of the same tensor, so only the files holding those are read.
SliceFilter overlapping(const std::vector<std::pair<std::string, SliceSpec>>& wanted);

// Verifies the manifest, the size of every file it names and the CRC32C of
// every file that holds a wanted piece, and loads the wanted pieces only: a
// rank of a sharded run reads its share, not the whole checkpoint. Throws
// std::runtime_error naming the file on any mismatch.
LoadedCheckpoint load_checkpoint(const std::string& dir, const SliceFilter& want = {});

// Assembles pieces of any layout from the loaded pieces of another.
class SliceAssembler {
 public:
  // Indexes ck's pieces by tensor name; ck must outlive the assembler.
  explicit SliceAssembler(const LoadedCheckpoint& ck);
  bool has(const std::string& name) const;
  // Fills dst (want.numel() elements of `dtype`, the box's row-major order)
  // with the elements `want` names. Throws std::runtime_error naming the
  // checkpoint and the tensor when it is absent, its dtype or global shape
  // differs from `want`, or the loaded pieces miss some wanted element (the
  // filter at load did not take them).
  void fill(const std::string& name, DType dtype, const SliceSpec& want, void* dst) const;

 private:
  const LoadedCheckpoint& ck_;
  std::unordered_multimap<std::string, const ShardTensor*> by_name_;
};

// checkpoint.resume as a list of directories to try, in order: "none" -> {};
// "auto" -> every step directory under root, `latest` first, then newest
// first; anything else is a path (a step directory, or a root whose `latest`
// names one) that must exist (throws otherwise).
std::vector<std::string> resume_candidates(const std::string& root, const std::string& mode);

// The step directory a path names (itself, or the one its `latest` names);
// throws naming `key`, the setting or flag the user gave the path with
// ("checkpoint.resume", "--checkpoint"), when it does not exist or is none.
std::string checkpoint_directory(const std::string& path, const std::string& key);

// Several ranks choose one checkpoint together, since each verifies only the
// files it reads: called on every rank with the candidate and whether it
// loaded here, returns how many ranks could not load it (0: it is taken).
using ResumeAgreement = std::function<int64_t(const std::string& dir, bool loaded_here)>;

// The first candidate that loads (on every rank, with `agree`). "auto": a
// candidate that fails is reported on stderr (by the ranks where it failed)
// and the next is tried; nullopt when there is no candidate at all, and when
// there are some but none loads this throws, on every rank, naming each and
// why (starting over is never implicit: checkpoint.resume=none). A path must
// load or this throws, on every rank.
// `pass_over` (auto only) reads each candidate's manifest first and skips,
// without loading, one it gives a reason for (they count as not loadable).
using ResumeFilter = std::function<std::string(const CheckpointMeta&)>;
std::optional<LoadedCheckpoint> resolve_resume(const std::string& root, const std::string& mode,
                                               const SliceFilter& want = {}, const ResumeAgreement& agree = {},
                                               const ResumeFilter& pass_over = {});

// The manifest of a checkpoint directory, verified (its own checksum, every
// field) without reading the rank files. Throws like load_checkpoint.
CheckpointMeta read_checkpoint_meta(const std::string& dir);

// The complete-looking step directories of a root (a manifest present),
// newest first, and the step `latest` names (nullopt: none or unreadable).
std::vector<std::pair<int64_t, std::string>> step_directories(const std::string& root);
std::optional<int64_t> latest_step(const std::string& root);

// Moves the step directories of `root` above `step` out of the way
// (step_N -> step_N.superseded, which no reader considers and pruning leaves
// alone): they belong to a timeline this run left (it resumed from an older
// step, or started over), and `auto` would otherwise prefer them after a
// crash. Returns the new names; failures throw naming the directory.
std::vector<std::string> set_aside_newer(const std::string& root, int64_t step);

// Human-readable summary for `trainer inspect DIR`.
std::string describe_checkpoint(const std::string& dir);

// Copies the elements of `src` that `dst_slice` holds into dst (laid out as
// dst_slice's data, src's dtype); returns how many. Throws
// std::invalid_argument naming the tensor when src is inconsistent (its data
// size, its slice) or the global shapes differ.
int64_t copy_overlap(const ShardTensor& src, const SliceSpec& dst_slice, void* dst);

}  // namespace trainer
