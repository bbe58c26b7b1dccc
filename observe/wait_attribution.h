// Who made the others wait. In a synchronous collective every member leaves
// at about the same moment, once the last one has arrived and the data has
// moved; so the member that spent the least time inside it arrived last, and
// each other member's time beyond that least time is time it spent waiting
// for that one. Summed over a log interval this names the rank the others
// waited for, even when its own time inside collectives is as long as
// theirs (a rank stopped mid-step spends the stop outside them, then finds
// them waiting), and it needs no clocks shared between hosts.
//
// Only groups whose members run the same program on the same schedule are
// read: tp, dp_cp, cp, ep and edp (with experts), and the host group (the
// loss and the gradient norm) when there is one pipeline stage. The pipeline's sends and
// receives pair different ranks per call, and with several stages the host
// group's collectives span stages whose arrival order the schedule fixes
// (the first stage ends the backward last in 1F1B): they would blame a
// stage for the bubble.
#pragma once

#include <memory>
#include <vector>

#include "comm/timed_communicator.h"

namespace trainer {

// `experts`: the model has experts (a dense model never uses ep and edp,
// and their reductions would be the monitor's only calls there).
inline bool attributes_waits(const std::string& label, int pipeline_stages, bool experts) {
  if (label == "ep" || label == "edp") return experts;
  return label != "pp" && (label != "host" || pipeline_stages == 1);
}

// Collective over every group of `groups` that attributes_waits() (each
// rank passes its own groups, in the same order of labels) and then over
// `host`: consumes each group's recorded collective times and returns, per
// global rank of `host`'s world, the seconds the other ranks waited for it,
// summed over the ranks that waited. A group whose members recorded
// different numbers of calls (a program that is not the same on every
// member) is skipped by all of them.
std::vector<double> attribute_waits(const std::vector<std::unique_ptr<TimedCommunicator>>& groups, Communicator& host,
                                    int pipeline_stages, bool experts);

}  // namespace trainer
