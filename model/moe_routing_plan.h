// A MoE layer's routing decisions that depend on more than one token: the
// load-balancing statistics and the capacity's admission order. Both are
// defined over a micro-batch's whole sequences, which context parallelism
// splits over the cp ranks; here they are made whole again, so every layout
// trains the one-process objective and drops the one-process tokens.
//
// - Statistics (tokens per expert, summed probabilities; ops
//   moe_router_stats) are sums over tokens: one all-reduce of [2, E] over
//   the cp group gives every rank the micro-batch's, from which each forms
//   the same aux loss and its own tokens' share of its gradient.
// - Capacity admits assignments k-major, then in token order over the
//   whole sequences (moe_dispatch_plan). Each rank holds two zigzag chunks
//   of every sequence, so the cp ranks all-gather their expert choices
//   ([N, K] I32 each), put them back in sequence order, run the one-process
//   plan on them and keep the decisions for their own rows.
//
// Tensor parallelism needs neither: every tp rank routes the whole
// (gathered, under sp) sequence rows of its cp rank with the same router.
#pragma once

#include "model/context_parallel.h"
#include "model/dims.h"
#include "model/activations.h"

namespace trainer {

// From a.probs and a.topk_idx: a.router_stats (the micro-batch's), a.aux,
// a.row_map and a.offsets (this rank's rows, admitted as one process would).
void moe_route_plan(const ModelDims& d, const ContextParallel& cp, LayerActs& a);

// Tokens the router statistics of a micro-batch cover: its whole sequences.
inline int64_t routed_tokens(const ModelDims& d) { return d.N() * d.cp; }

}  // namespace trainer
