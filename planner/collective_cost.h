// How the time model prices one collective on one link (planner/step_estimate.h
// "Links"): the bytes each rank sends for a payload (ring algorithms), the
// messages of its ring, and the link's bandwidth and latency from the
// hardware entry. The step estimate and `trainer calibrate` (which fits the
// hardware numbers to measured collectives) both price through these, so
// a calibrated entry predicts what was measured by construction of the
// same formula, not of a copy of it.
#pragma once

#include "comm/timed_communicator.h"
#include "planner/hardware.h"

namespace trainer {

// Messages in sequence on a group of p ranks: 2(p-1) for an all-reduce
// (reduce-scatter then all-gather rings), p-1 for the other collectives, 1
// for a send (its receive is the same message: 0).
double ring_steps(CommKind kind, int p);

// Bytes each rank sends per payload byte (payload as comm/timed_communicator.h
// counts it: an all-gather's output, a reduce-scatter's input): 2(p-1)/p for
// an all-reduce, (p-1)/p for the other collectives, 1 for a send, 0 for a receive.
double wire_share(CommKind kind, int p);

// Seconds of latency of one call: collective_latency_us plus a step latency
// per message; a send pays its one message only.
double call_latency(CommKind kind, int p, double step_latency_s, const Hardware& hw);

// Bytes/s per rank and direction: inside a node half the data sheet's
// both-directions figure; across nodes network_gbit_s per GPU times the
// group's members on this rank's node (they share the node's NICs).
double link_bandwidth(const Hardware& hw, bool across_nodes, int members_per_node);
// Seconds per message on the link.
double step_latency(const Hardware& hw, bool across_nodes);

// One call of `payload` bytes on a group of p ranks, latency included.
double collective_seconds(CommKind kind, int p, double payload, bool across_nodes, int members_per_node,
                          const Hardware& hw);

}  // namespace trainer
