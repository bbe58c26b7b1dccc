// Runs a schedule (pipeline/schedule.h) on paper before it runs on ranks:
// checks that it is complete and can run (every micro-batch's forward and
// backward on every virtual stage exactly once and in order, every send meets
// a receive of the same tensor, no deadlock as the executor transfers in
// the given TransferMode: a batch finishes when each of its receives has
// met its send (and, with blocking sends, each send its receive), and a
// rank that gives a slot back waits until the slot's sends were received),
// and with per-rank action costs computes
// the step time, each rank's idle time (the bubble) and its peak number of
// micro-batches whose activations are held.
#pragma once

#include <string>
#include <vector>

#include "pipeline/schedule.h"

namespace trainer {

// Time of one action of one micro-batch on one model chunk of a rank.
struct ActionCosts {
  double forward = 1, backward = 2;
  double backward_input = 1, backward_weight = 1;  // the halves of a split backward
  double of(ActionKind k) const;
};

struct TimedAction {
  Action action;
  double start = 0, end = 0;
};

struct Simulation {
  bool ok = false;
  std::string error;                          // rank, action and why, when !ok
  double step_time = 0;                       // when the last rank finishes
  std::vector<double> busy;                   // per rank: time computing
  std::vector<int> peak_in_flight;            // per rank: (micro-batch, chunk) between forward and backward at once
  // Per rank: activation slots the executor holds at once. A micro-batch
  // takes its slot when the rank first touches it (the receive of its input,
  // or its forward) and gives it back as slot_releases says (its weight
  // gradients done and its input gradient sent); a batch that sends one
  // micro-batch's gradient and receives the next one's input holds both.
  std::vector<int> peak_slots;
  std::vector<std::vector<int>> peak_chunk_slots;  // per rank and model chunk
  std::vector<std::vector<TimedAction>> timeline;  // per rank: compute actions with their times
  // Idle share of the step: mean over ranks of (step_time - busy) / step_time.
  double bubble() const;
};

// How the executor moves a batch's messages (pipeline/executor.h), which
// decides when a rank waits. The default is the CPU (Gloo) executor with
// parallel.overlap on.
struct TransferMode {
  // Sends return at once and are waited for only when their slot is given
  // back. false: a batch finishes only once its sends were received too
  // (NCCL's grouped sends and receives on the compute stream, and
  // parallel.overlap false).
  bool nonblocking_sends = true;
  // Receives posted one batch ahead (early_receive_posting), taking a
  // received activation's slot then. false: posted when the rank reaches
  // their batch.
  bool early_receives = true;
  // Time one message takes once both of its ends have posted it (a
  // rendezvous: Gloo moves no data before the receiver asks for it).
  double transfer = 0;
};

// costs: one entry per rank, or one for all.
Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& costs = {ActionCosts{}},
                    const TransferMode& mode = {});

// The textbook bubble of GPipe and 1F1B with equal stages: (p - 1) / (m + p - 1).
double theoretical_bubble(int stages, int microbatches);

// The textbook bubble of a schedule with equal stages and F = BI = BW = 1,
// B = 2: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v m + p-1) interleaved,
// (p-1)/(3m + p-1) for ZB-H1 (its drain idles F + BI - BW = 1 unit per
// stage instead of F + B = 3).
struct TextbookBubble {
  const char* formula;
  double value;
};
TextbookBubble textbook_bubble(const Schedule& s);

// A text picture of the timeline: one row per rank, one cell per `unit` of
// time, "F3" for a forward of micro-batch 3, "B3" for its backward, "." idle.
std::string format_timeline(const Simulation& sim, double unit = 1);

}  // namespace trainer
