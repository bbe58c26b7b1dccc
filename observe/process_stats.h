// What the kernel counts for this process, for the lines a run prints: its
// start-up before the first step and its peak memory after the last.
#pragma once

#include <cstddef>

namespace trainer {

// Seconds since the process started (so loading shared libraries and the
// re-exec of app/main.cpp count); < 0 where /proc cannot tell.
double process_age_seconds();
// The peak resident set (VmHWM) in bytes; 0 where /proc cannot tell. Read
// here rather than by a parent's wait4, whose figure starts at the parent's
// own size (a fork's pages count until exec).
size_t peak_resident_bytes();

}  // namespace trainer
