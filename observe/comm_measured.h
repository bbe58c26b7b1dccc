// What each process group of a run moved per training step, as its
// TimedCommunicator counted it (comm/timed_communicator.h), for the
// end-of-run report and metrics.jsonl: the plan's prediction
// (planner/comm_plan.h, `trainer plan`) compares one to one, and the e2e
// test of the plan holds them equal. Everything between the first step
// and the last counts, evaluation batches included: a run with
// train.eval_interval > 0 reports more than the plan's training step.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/timed_communicator.h"

namespace trainer {

// The counters of every group now, in timed_groups() order.
std::vector<CommBytes> comm_bytes_now(const std::vector<std::unique_ptr<TimedCommunicator>>& groups);

// Per group of more than one rank (the host group left out: loss sums and
// flags, not training traffic), bytes per step on this rank and, summed
// over `host` (collective: every rank calls it), the mean over ranks:
//   "comm measured per step, tp (2 ranks): all_reduce=1024 all_gather=0 ... | mean over ranks: all_reduce=1024 ..."
// and the same as one metrics.jsonl object in *json.
std::string comm_measured_report(const std::vector<std::unique_ptr<TimedCommunicator>>& groups,
                                 const std::vector<CommBytes>& since, int64_t steps, Communicator& host,
                                 std::string* json);

}  // namespace trainer
