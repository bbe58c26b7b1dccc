// Runs a test body on N real processes (forked children), each with its
// ProcessGroups built exactly as the trainer builds them (rank 0 serves the
// store on a loopback port). A child reports through a pipe ("" when all
// checks passed, else what failed, then its note) and waits for the parent
// to release it, so that no rank tears down its connections, or rank 0 its
// store, while another still needs them.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/process_group.h"

namespace trainer::test {

// Checks inside a child throw; the message goes back to the parent.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define CHILD_CHECK(cond, what)                                                                         \
  do {                                                                                                  \
    if (!(cond)) throw CheckFailed(std::string("line ") + std::to_string(__LINE__) + ": " + (what));   \
  } while (0)

struct ChildResult {
  int rank = 0;
  bool reported = false;
  std::string report;  // "" : every check passed
  int exit_code = -1;  // -N: killed by signal N
};

using Body = std::function<void(ProcessGroups&, std::string& note)>;

struct Run {
  int world = 2;
  MeshShape mesh;
  double timeout_s = 10;
  // Ranks that never report (they hang on purpose); killed once the others did.
  std::vector<int> silent;
  // Ranks that never create their ProcessGroups at all.
  std::vector<int> absent;
  double deadline_s = 25;
  // ProcessGroupOptions::host_staged: the groups copy through host buffers.
  bool host_staged = false;
};

// Forks run.world children; each builds ProcessGroups and runs body, whose
// `note` is returned as part of the report (timings, messages).
std::vector<ChildResult> run_ranks(const Run& run, const Body& body);

// Every child reported and exited 0 (Catch2 checks, each naming the rank).
void require_all_passed(const std::vector<ChildResult>& results);

}  // namespace trainer::test
