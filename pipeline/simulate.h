// Runs a schedule (pipeline/schedule.h) on paper before it runs on ranks:
// checks that it is complete and can run (every micro-batch's forward and
// backward on every virtual stage exactly once and in order, every send meets
// a receive of the same tensor, no deadlock as the executor transfers: a
// batch finishes when the sender of each of its receives has posted that
// send, sends never wait, and a rank that gives a slot back waits until
// the receivers of the slot's sends have posted them), and with per-rank
// action costs computes
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

// costs: one entry per rank, or one for all.
Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& costs = {ActionCosts{}});

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
