#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "comm/communicator.h"
#include "train/checkpointing.h"

namespace trainer {

namespace fs = std::filesystem;

namespace {

std::string holder_line() {
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  host[sizeof host - 1] = '\0';
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
}

// Who holds the lock, as its holder wrote it. The holder writes right after
// it got the lock, so a loser of a simultaneous start may look too early:
// it retries for a moment before calling the holder unknown.
std::string read_holder(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    char buf[512];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      std::string s(buf, size_t(n));
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "a process that has not yet written its pid";
}

// Compared as absolute, normalised paths (symlinks resolved where the path
// exists): a second flock on the same file from this process would fail.
bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::weakly_canonical(fs::absolute(a), ec) == fs::weakly_canonical(fs::absolute(b), ec);
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir + ": cannot create directory to lock it: " + ec.message());
  file_ = (fs::path(dir) / kRunLockName).string();
  fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(file_ + ": cannot open lock file: " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string msg;
    if (err == EWOULDBLOCK)
      msg = dir + " is in use by another trainer: " + read_holder(fd_) + " (lock file " + file_ +
            "). Wait for that run to end or stop it, or give this one another run.dir / checkpoint.dir";
    else
      msg = file_ + ": cannot lock: " + std::strerror(err);
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) throw DirectoryInUse(msg);
    throw std::runtime_error(msg);
  }
  // Ours now: record who we are for the next one that finds it taken.
  const std::string line = holder_line();
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, line.data(), line.size(), 0) != ssize_t(line.size()))
    std::fprintf(stderr, "run lock: warning: could not record the holder in %s: %s\n", file_.c_str(),
                 std::strerror(errno));
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);
}

RunLock::RunLock(const Config& cfg, bool lead, Communicator& host) {
  std::string in_use;  // rank 0's DirectoryInUse message
  if (lead) {
    std::vector<std::string> dirs = {cfg.run_dir()};
    const std::string root = checkpoint_root(cfg);
    // The root has a lock of its own even inside the run directory: another
    // run whose checkpoint.dir points there holds a different run.dir. It is
    // locked when this run writes there; one it only resumes from may be
    // read-only.
    if (cfg.checkpoint.interval > 0 && !same_directory(root, cfg.run_dir())) dirs.push_back(root);
    for (const std::string& d : dirs) {
      try {
        locks_.push_back(std::make_unique<DirectoryLock>(d));
        files_.push_back(locks_.back()->file());
      } catch (const DirectoryInUse& e) {
        in_use = e.what();
        break;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "run lock: warning: %s; running without a lock on %s\n", e.what(), d.c_str());
      }
    }
  }
  double taken_elsewhere = in_use.empty() ? 0 : 1;
  host.all_reduce(Tensor(&taken_elsewhere, DType::F64, {1}));
  if (!in_use.empty()) throw DirectoryInUse(in_use);
  if (taken_elsewhere > 0)
    throw DirectoryInUse("rank 0 found the run directory " + cfg.run_dir() +
                         " in use by another trainer (see its message)");
}

}  // namespace trainer
