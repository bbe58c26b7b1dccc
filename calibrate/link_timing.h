// Times the collectives of one link (`trainer calibrate`): all_reduce,
// all_gather, reduce_scatter and a send/receive, each over a range of
// payload sizes, on a group whose members share that link (the ranks of
// a node for inside a node, one rank per node for across nodes), with the
// link's other groups timed at the same moment (LinkGroup::concurrent).
//
// Each size runs `warmup` calls, then `repetitions` timed ones, each after
// a barrier of every rank of the job, so that the members start together
// and the others wait one call at most. A call's time is the slowest
// member's (a collective is done when its last member is); a send/receive
// is half of a round trip between the group's ranks 0 and 1 (one message
// each way, so the barrier's skew does not enter). The size's time is the
// median of its repetitions, of which a size below 1 MiB gets up to 4 times
// as many: a short call is the one a moment's interference (another process
// on the core, a scheduler tick) spoils, and a median of 7 spoiled by a
// burst of it was seen on 2 cores.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "planner/link_fit.h"
#include "runtime/watchdog.h"

namespace trainer {

struct LinkTimingOptions {
  std::vector<int64_t> sizes;  // payload bytes, ascending (rounded down to whole F32 elements per rank)
  int warmup = 1;
  int repetitions = 5;
};

// Timed calls of a payload: base x (1 MiB / bytes), between base and 4 base.
int repetitions_of(int64_t bytes, int base);

// 4 KiB x 4^k from min_bytes up to max_bytes (at least the first power
// from min_bytes on).
std::vector<int64_t> calibration_sizes(int64_t min_bytes, int64_t max_bytes);

// Bytes of device memory time_link allocates for these sizes.
int64_t link_buffer_bytes(const LinkTimingOptions& o);

// What a link is, for every rank of the job.
struct LinkGroup {
  std::string label;          // "inside node trn-node0", "across nodes"
  bool across_nodes = false;
  std::vector<int> members;   // global ranks of the first group (the one named)
  // Every group timed at once, `members` first, all of its size: each
  // node's ranks inside a node; across nodes one ring per local rank (the
  // i-th rank of every node), as the run's rings share a node's links.
  std::vector<std::vector<int>> concurrent;
  int members_per_node = 1;
};

// Collective over `host` (every rank of the job): the members of each of
// the link's groups run the collectives on `group`, the one this rank is in
// (nullptr on a rank in none), then every rank joins
// the reduction of the times, so that all of them return the same series,
// one per collective, each call's time the slowest of any group's members.
// `device`: where the buffers live (the group's).
// A failed call throws std::runtime_error naming the collective, the size
// and the group. `watchdog` (may be null) hears of every size.
std::vector<CollectiveTimes> time_link(Communicator* group, Communicator& host, const LinkGroup& link, Device device,
                                       const LinkTimingOptions& o, Watchdog* watchdog);

}  // namespace trainer
