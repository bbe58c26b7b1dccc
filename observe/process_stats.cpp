#include "observe/process_stats.h"

#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace trainer {

double process_age_seconds() {
  std::ifstream in("/proc/self/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // Field 2, the command, is in parentheses and may hold spaces: count the
  // fields after its closing one. starttime is field 22, in clock ticks
  // since boot.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  for (int i = 3; i < 22; ++i) rest >> field;
  unsigned long long start_ticks = 0;
  if (!(rest >> start_ticks)) return -1;
  timespec now{};
  if (clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  const long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) return -1;
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9 - double(start_ticks) / double(hz);
}

size_t peak_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

ProcessSample sample_process() {
  ProcessSample p;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) p.resident_bytes = double(std::stoull(line.substr(6))) * 1024;
    if (line.rfind("Threads:", 0) == 0) p.threads = double(std::stoull(line.substr(8)));
  }
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec))
    p.open_fds += 1;
  if (p.open_fds > 0) p.open_fds -= 1;  // the iterator's own descriptor of the directory
  return p;
}

double directory_bytes(const std::string& dir) {
  namespace fs = std::filesystem;
  // A directory removed under the walk (a rotated checkpoint) ends it with
  // an error: walk again, a few times at most.
  for (int attempt = 0;; ++attempt) {
    double total = 0;
    std::error_code ec;
    auto it = fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code size_ec;
      if (it->is_regular_file(size_ec)) {
        const auto n = it->file_size(size_ec);
        if (!size_ec) total += double(n);
      }
    }
    if (!ec || attempt == 3) return total;
  }
}

}  // namespace trainer
