#include "checkpoint/fault_injection.h"

#include <signal.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace trainer {

namespace {

std::mutex g_mu;
CheckpointFault g_fault;       // guarded by g_mu
bool g_env_read = false;       // the environment is read once, at the first arrival

constexpr const char* kStages[] = {"prepare", "rank_file", "manifest", "publish", "latest", "prune"};

struct ErrnoName {
  const char* name;
  int value;
};
constexpr ErrnoName kErrnos[] = {
    {"ENOSPC", ENOSPC}, {"EROFS", EROFS}, {"EACCES", EACCES}, {"EDQUOT", EDQUOT}, {"EIO", EIO}};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep)
      out.emplace_back();
    else
      out.back().push_back(c);
  }
  return out;
}

int parse_count(const std::string& s, const std::string& spec) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 0 || v > 1000000)
    throw std::invalid_argument(std::string(kCheckpointFaultEnv) + "=\"" + spec + "\": \"" + s +
                                "\" is not a count");
  return int(v);
}

}  // namespace

CheckpointFault parse_checkpoint_fault(const std::string& spec) {
  const std::vector<std::string> parts = split(spec, ':');
  const std::string bad = std::string(kCheckpointFaultEnv) + "=\"" + spec + "\": ";
  if (parts.size() > 4) throw std::invalid_argument(bad + "expected STAGE[:ERRNO[:SKIP[:TIMES]]]");
  CheckpointFault f;
  f.stage = parts[0];
  bool known = false;
  for (const char* s : kStages) known = known || f.stage == s;
  if (!known)
    throw std::invalid_argument(bad + "unknown stage \"" + f.stage +
                                "\" (prepare, rank_file, manifest, publish, latest, prune)");
  if (parts.size() > 1 && parts[1] == "KILL") {
    f.kill = true;
  } else if (parts.size() > 1) {
    bool found = false;
    for (const ErrnoName& e : kErrnos)
      if (parts[1] == e.name) f.error = e.value, found = true;
    if (!found) throw std::invalid_argument(bad + "unknown errno \"" + parts[1] + "\" (ENOSPC, EROFS, EACCES, EDQUOT, EIO, or KILL)");
  }
  if (parts.size() > 2) f.skip = parse_count(parts[2], spec);
  if (parts.size() > 3) f.times = parse_count(parts[3], spec);
  return f;
}

void checkpoint_inject_fault(const CheckpointFault& fault) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_env_read = true;  // an explicit arming wins over the environment
  g_fault = fault;
}

void checkpoint_fail_next_save_at(const std::string& stage) { checkpoint_inject_fault({stage, ENOSPC, 0, 1}); }

namespace ckpt_detail {

void maybe_inject_failure(const char* stage, const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_env_read) {
    g_env_read = true;
    if (const char* spec = std::getenv(kCheckpointFaultEnv); spec && *spec) g_fault = parse_checkpoint_fault(spec);
  }
  if (g_fault.stage.empty() || g_fault.stage != stage || g_fault.times <= 0) return;
  if (g_fault.skip > 0) {
    --g_fault.skip;
    return;
  }
  const int err = g_fault.error;
  if (g_fault.kill) ::raise(SIGKILL);  // kill -9 in the middle of the save
  if (--g_fault.times == 0) g_fault.stage.clear();
  throw std::runtime_error(path + ": injected failure at stage '" + stage + "' (test hook): " + std::strerror(err));
}

}  // namespace ckpt_detail
}  // namespace trainer
