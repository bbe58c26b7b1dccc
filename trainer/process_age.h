// Seconds since this process started, as the kernel counts it (so the time
// spent loading shared libraries and in the re-exec of trainer/main.cpp is
// included): the start-up line every run prints before its first step.
#pragma once

namespace trainer {

// < 0 where /proc cannot tell.
double process_age_seconds();

}  // namespace trainer
