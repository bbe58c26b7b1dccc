// Activation recompute (train.recompute): a layer that recomputes keeps less
// of its forward in the micro-batch's activation slot, and its backward
// first runs again the part of the forward that wrote what was dropped.
//
//   selective  drops what costs no weight matmul to rebuild: the norm outputs
//              h1 and h2 (from the kept residual and its statistics; under
//              sequence parallelism one all-gather each), the attention output
//              and log-sum-exp o, lse (the attention core from the kept q, k, v;
//              under context parallelism the ring again) and the FFN
//              activation act / eact (from the kept pre-activations).
//   full       keeps only the block input x_in and runs the whole block again:
//              one more forward of its matmuls and every forward collective
//              (tp, cp ring, ep all-to-all).
//
// What is dropped lives once per model, not once per slot: all recomputing
// layers of every slot point at one shared copy (GradScratch::recompute),
// which the forward overwrites layer after layer and the backward refills
// just before the layer that reads it. The kernels are deterministic, so the
// recomputed values, and the gradients, are bitwise those of a run that
// kept them.
#pragma once

#include <string>

#include "comm/communicator.h"
#include "model/activations.h"
#include "model/context_parallel.h"
#include "model/dims.h"
#include "model/params.h"
#include "model/tensor_parallel.h"

namespace trainer {

const char* recompute_name(Recompute mode);  // "none", "selective", "full"

// Whether a layer under `mode` leaves `field` (its name in activation_specs,
// without the "layers.i." prefix) out of the slot.
bool recomputed_field(Recompute mode, const std::string& field);

// Before layer `a`'s backward: what `mode` dropped, recomputed into the
// shared copy `a` points at. moe_out: the slot's combine buffer; scratch: a
// free [rows, C] buffer for full recompute's block output, which nobody reads.
void recompute_layer(const ModelDims& d, Recompute mode, bool moe, const TensorParallel& tp,
                     const ContextParallel& cp, Communicator& ep, const LayerWeights& w, LayerActs& a, Tensor moe_out,
                     Tensor scratch);

}  // namespace trainer
