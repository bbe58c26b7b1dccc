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

// The mean validation loss per token. Each rank evaluates its share of the
// validation batches (split like a training step), so the loss does not
// depend on dp or the micro-batch size. The tensor-parallel ranks of a
// replica compute the same losses; one of them (`counts`) adds them to the
// sum over all ranks (collective over `host`).
double evaluate(const HostBatch& hb, StageModels& stage, Communicator& pp, Communicator& host, int dp, bool counts,
                int64_t tokens_per_micro);

}  // namespace trainer
