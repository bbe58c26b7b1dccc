// Smoke-test mode: runs the real configuration and data for a few hundred
// steps with checkpoints in a temporary directory, then prints a verdict
// table (memory, finiteness, loss falling, throughput, checkpoint round trip)
// and exits 0 only when every check passes. What a user runs before a long job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "train/engine.h"

namespace trainer {

struct SmokeCheck {
  std::string name;
  bool pass = false;
  std::string detail;
};

// Judges a finished smoke run (pure: tested on synthetic summaries).
std::vector<SmokeCheck> judge_smoke(const TrainSummary& s, size_t device_bytes);
std::string format_verdict(const std::vector<SmokeCheck>& checks);

// Runs the smoke test; returns the process exit code (0 all passed, 1 not).
// Under a launcher every rank runs it together (the same layout as the real
// run); its files then go to <run dir>/smoke-test, which all ranks share,
// instead of a private temporary directory, and rank 0 prints the verdict
// that every rank returns.
int run_smoke_test(Config cfg, int64_t steps, const LaunchInfo& launch = {});

}  // namespace trainer
