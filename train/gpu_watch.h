// Each rank's GPU through NVML (runtime/nvml.h) in the loop: opened at the
// start, with one line on rank 0 saying what is read or why nothing is; its
// sample goes to the rank monitor every log window (observe/rank_monitor.h);
// its uncorrected ECC count is checked after every step, and an increase is
// reported at once by the rank that sees it.
#pragma once

#include <cstdint>

namespace trainer {

struct Session;

void open_gpu_watch(Session& s);
void check_gpu_errors(Session& s, int64_t step);

}  // namespace trainer
