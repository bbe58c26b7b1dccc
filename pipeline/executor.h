// Runs this rank's actions of a pipeline schedule (pipeline/schedule.h) on
// the model's stage pieces (model/transformer.h): forwards and backwards of
// micro-batches in the schedule's order, each micro-batch's activations in
// its own slot from the first time the rank touches it (its forward, or the
// receive of its input) until its weight gradients are done and its input
// gradient has been sent (slot_releases); the transfers of consecutive
// actions in one batch_send_recv_posted over the pipeline group, whose
// sends are waited for only when their slot is given back (or at the end of
// the step), and whose receives were posted when the batch before finished. Split backwards (BI, BW) run the model's input and weight
// halves. One process is a pipeline of one stage, which runs the same code.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "model/transformer.h"
#include "pipeline/schedule.h"
#include "pipeline/simulate.h"

namespace trainer {

struct PipelineStepResult {
  double loss_sum = 0;  // this rank's (the last stage's) cross-entropy sum
  double aux_sum = 0;   // load-balancing loss of this rank's MoE layers
  double wait_s = 0;    // time blocked in transfers: receives, and sends not yet delivered when their slot is reused
  // Compute time of the forwards and the backwards (split halves included),
  // without the time their collectives (tp, ep, cp) blocked
  // (comm/timed_communicator.h).
  double forward_s = 0, backward_s = 0;
  // This rank's compute actions as they ran, in seconds from the step's
  // start: the simulator's timeline, measured.
  std::vector<TimedAction> timeline;
};

// How a step transfers (pipeline/simulate.h TransferMode, whose simulation
// is what the step does), and a call as each compute action starts (a
// profiler's range; a test stands in a known cost with it).
struct PipelineStepOptions {
  TransferMode mode;
  std::function<void(const Action&)> on_compute;
};

// Loads micro-batch mb's tokens into its (already acquired) activation slot
// of a chunk's model.
using MicroBatchLoader = std::function<void(Model& chunk, int64_t mb)>;

// One training step: this rank's actions, with the gradients scaled as the
// engine says (ce_scale into the logit gradient, aux_grad per MoE layer).
// `pp` is the pipeline group (rank = stage); chunks[c] is this rank's model
// chunk c (one without interleaving). Parameter gradients accumulate; the
// unit hooks learn from MicroBatch::last which backward completes them.
// Blocking sends (the no-overlap baseline of parallel.overlap) are waited
// for as soon as their batch is posted, not when their slot is reused.
// Early receives are posted one batch ahead where the backend can
// (Communicator::post_receives), else in their batch; their slots are taken
// one batch ahead either way, as the simulator counts them.
PipelineStepResult run_pipeline_step(const std::vector<Model*>& chunks, Communicator& pp,
                                     const std::vector<Action>& actions, float ce_scale, float aux_grad,
                                     const MicroBatchLoader& load, const PipelineStepOptions& options = {});

// Forwards only (evaluation): micro-batches 0..n-1, each through the
// virtual stages in order, activations passed to the next one.
PipelineStepResult run_pipeline_forward(const std::vector<Model*>& chunks, Communicator& pp, int64_t microbatches,
                                        const MicroBatchLoader& load);

}  // namespace trainer
