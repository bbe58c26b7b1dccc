// What the kernel counts for this process, for the lines a run prints: its
// start-up before the first step and its peak memory after the last, and
// the samples a long run records to show it does not leak.
#pragma once

#include <cstddef>
#include <string>

namespace trainer {

// Seconds since the process started (so loading shared libraries and the
// re-exec of app/main.cpp count); < 0 where /proc cannot tell.
double process_age_seconds();
// The peak resident set (VmHWM) in bytes; 0 where /proc cannot tell. Read
// here rather than by a parent's wait4, whose figure starts at the parent's
// own size (a fork's pages count until exec).
size_t peak_resident_bytes();

// What a long run must not accumulate (log.resources_interval): resident
// memory (VmRSS), open file descriptors (/proc/self/fd) and threads.
struct ProcessSample {
  double resident_bytes = 0, open_fds = 0, threads = 0;
};
ProcessSample sample_process();
// Bytes of the regular files under `dir` (0 when it does not exist; files
// that vanish while it walks, as checkpoint rotation deletes them, are skipped).
double directory_bytes(const std::string& dir);

}  // namespace trainer
