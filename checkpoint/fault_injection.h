// Test hook: make checkpoint saves fail at a chosen stage the way a full or
// read-only filesystem would, so that the failure paths (nothing published,
// `latest` untouched, checkpoint.on_save_error) can be tested without a
// real full disk. Tests run as root, where chmod cannot make a directory
// read-only, and a tmpfs cannot be mounted; this reaches every stage.
//
// Stages, in the order a save reaches them:
//   "prepare"    creating step_N.partial/ (a read-only or full filesystem fails here first)
//   "rank_file"  after the rank file, before the manifest
//   "manifest"   after the manifest, before the rename
//   "publish"    after an existing directory of the same step was moved aside, before the rename
//   "latest"     checkpoint complete, before `latest` is replaced
//   "prune"      an old checkpoint renamed to step_N.deleting, before it is deleted (as if
//                the process were killed there: the rest of the pruning is not done)
// In a group only rank 0 reaches the last four; "prepare" is rank 0's too.
#pragma once

#include <cerrno>
#include <optional>
#include <string>

namespace trainer {

struct CheckpointFault {
  std::string stage;   // "" disarms
  int error = ENOSPC;  // the errno whose text the failure reports
  int skip = 0;        // arrivals at the stage that pass before the first failure
  int times = 1;       // failing arrivals after those; then the hook disarms itself
  bool kill = false;   // SIGKILL this process at the stage instead (a kill -9 mid-save)
};

// Arms the hook for every writer of this process (replacing what was armed).
void checkpoint_inject_fault(const CheckpointFault& fault);
// The next arrival at `stage` fails with ENOSPC; "" disarms.
void checkpoint_fail_next_save_at(const std::string& stage);

// The environment variable that arms the hook in the trainer binary, read at
// the first save of the process: "STAGE[:ERRNO[:SKIP[:TIMES]]]", ERRNO one of
// ENOSPC, EROFS, EACCES, EDQUOT, EIO, e.g. "prepare:EROFS:1:1" fails the
// second save as a read-only filesystem would; KILL in its place SIGKILLs the
// process there ("rank_file:KILL": killed with its file written, its report
// not).
constexpr const char* kCheckpointFaultEnv = "TRAINER_TEST_CHECKPOINT_FAULT";
// Throws std::invalid_argument naming the variable when `spec` is malformed.
CheckpointFault parse_checkpoint_fault(const std::string& spec);

namespace ckpt_detail {
// Called by the writer at each stage with the path it is about to write;
// throws std::runtime_error "<path>: injected failure at stage '<stage>'
// (test hook): <strerror>" when armed for this stage.
void maybe_inject_failure(const char* stage, const std::string& path);
}  // namespace ckpt_detail

}  // namespace trainer
