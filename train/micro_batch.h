// A micro-batch of a step's host batch into a model chunk, and the
// evaluation over the validation batches.
#pragma once

#include <cstdint>

#include "comm/communicator.h"
#include "data/prefetch.h"
#include "model/transformer.h"

namespace trainer {

class StageModels;

// Micro-batch `micro` of a batch into its activation slot of chunk `m`
// (held by then); under context parallelism this rank's two chunks of every
// sequence (data/batch_share.h).
void load_micro_batch(const HostBatch& hb, Model& m, int64_t micro);

// The share of a step's targets (all data-parallel ranks' batches together)
// that are predicted (>= 0): 1 for packed data without a loss mask; separate
// documents leave out the targets across a boundary, a loss mask (chat
// fine-tuning) those it masks out. The loss is the mean over those, so it does
// not depend on dp, accumulation or how documents fall into sequences.
// counts_batch: this rank is the one of its replica whose batch is counted
// (tp, cp and pp coordinate 0); collective over `host` when hb.masked.
double predicted_share(const HostBatch& hb, Communicator& host, bool counts_batch);

// The mean validation loss per predicted token. Each rank evaluates its share of the
// validation batches (split like a training step), so the loss does not
// depend on dp or the micro-batch size. The tensor-parallel ranks of a
// replica compute the same losses; one of them (`counts`) adds them to the
// sum over all ranks (collective over `host`); share: predicted_share of hb.
double evaluate(const HostBatch& hb, StageModels& stage, Communicator& pp, Communicator& host, int dp, bool counts,
                int64_t tokens_per_micro, double share);

}  // namespace trainer
