// One job per run directory. Two trainers on one directory would interleave
// metrics.jsonl, prune each other's checkpoints and move `latest` back and
// forth, each believing its own resume; the second one is stopped at
// start-up instead (exit 2, naming the holder).
//
// The lock is flock(LOCK_EX) on DIR/trainer.lock, which also records who
// holds it (pid, host, since when). The kernel drops the lock when the
// holder's process ends in any way, kill -9 included, so a leftover file
// never blocks a later run; the file is not deleted on exit (deleting a lock
// file races with the next process opening it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

namespace trainer {

class Communicator;

// Another process holds the lock. A ConfigError, so main() exits 2: the
// command line points at a directory that is in use.
struct DirectoryInUse : ConfigError {
  using ConfigError::ConfigError;
};

constexpr const char* kRunLockName = "trainer.lock";

class DirectoryLock {
 public:
  // Creates `dir` and its lock file as needed and takes the lock without
  // waiting. Throws DirectoryInUse naming the directory and the holder when
  // another process has it; std::runtime_error naming the file when the lock
  // cannot be taken for any other reason (unwritable directory, a filesystem
  // without locks).
  explicit DirectoryLock(const std::string& dir);
  ~DirectoryLock();  // releases the lock (closing the file does)
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  int fd_ = -1;
};

// The locks a run holds while it trains: its run directory and, when the run
// saves checkpoints (checkpoint.interval > 0), the checkpoint root, inside
// the run directory or not (another run's checkpoint.dir may point there
// from a run.dir of its own). Only rank 0 locks:
// every rank of a job writes its checkpoint files under that one root
// (checkpoint_root(): the same for all ranks, on a filesystem they share),
// and rank 0 alone publishes and deletes there, so holding the root on rank
// 0 covers the whole job, while ranks on other hosts locking the same file
// would only lock each other out. One all-reduce over `host` tells every rank
// the outcome, so a job whose directory is in use stops on every rank (exit
// 2). A lock that cannot be taken for another reason is a warning: it guards
// against a second trainer, it is not needed to train.
class RunLock {
 public:
  RunLock(const Config& cfg, bool lead, Communicator& host);
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::vector<std::unique_ptr<DirectoryLock>> locks_;
  std::vector<std::string> files_;
};

}  // namespace trainer
