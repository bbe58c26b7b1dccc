// Tensor parallelism inside a block (Megatron's recipe): the first linear of
// a sub-layer is column-parallel (each tp rank computes its heads or FFN
// columns from the whole input), the last one row-parallel (each rank's
// output is a partial sum over its heads or columns). Each of the two meets
// the residual stream through a pair of conjugate regions, one forward and
// its mirror in backward:
//
//                      without sp                     with sp (sequence parallel)
//   column input   fwd identity / bwd all-reduce   fwd all-gather / bwd reduce-scatter
//   row output     fwd all-reduce / bwd identity   fwd reduce-scatter / bwd all-gather
//
// With sp the residual stream, the norms and the residual adds hold only
// this rank's rows of the micro-batch (rows [r N/tp, (r+1) N/tp) of the B*T
// token rows; every op there is per token, so any token split computes the
// same numbers), and activation memory in those regions falls to 1/tp. The
// norm outputs that feed column-parallel linears are kept at 1/tp too: they
// are gathered into one shared [N, C] buffer for the forward matmuls and
// gathered again in backward for the weight gradients (Megatron's choice:
// one more all-gather per norm output for (tp - 1)/tp of its memory).
// A group of one makes every region a no-op, so a single process runs the
// same code.
//
// The vocabulary-parallel embedding and cross-entropy (model/transformer.cpp)
// use the same regions: the embedding's output is a partial sum over the
// vocabulary shards (a row output), the head's input a column input.
#pragma once

#include "comm/communicator.h"
#include "model/dims.h"

namespace trainer {

// What a block needs for tensor parallelism: the group, and with sp two
// full-sequence [N, C] scratches: `full` (a row-parallel output before its
// reduce-scatter, a gathered output gradient in backward) and `gathered` (a
// norm output's whole sequence, for a column-parallel linear). Both regions
// of a sub-layer run inside one call, so one pair serves every layer.
struct TensorParallel {
  Communicator* group = nullptr;
  Tensor full, gathered;
  Communicator& comm() const { return *group; }
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

// This rank's token rows of a full [N, ...] tensor under sp; all of it otherwise.
Tensor own_rows(const ModelDims& d, const TensorParallel& tp, Tensor full);

// Column input: `mine` holds this rank's rows of a norm output; returns the
// whole sequence's (sp: all-gathered into tp.gathered; else `mine`, whole).
// Forward runs it before the column-parallel linears, backward again before
// their weight gradients.
Tensor column_input(const ModelDims& d, const TensorParallel& tp, Tensor mine);
// The whole-sequence shape of a column input without its values, for a
// linear_backward that only computes the input gradient (which reads its
// `inp` for the row count alone): no all-gather.
Tensor column_input_shape(const ModelDims& d, const TensorParallel& tp, Tensor mine);
// Column input, backward: `dfull` [N, C] holds this rank's partial input
// gradient; returns the summed gradient of this rank's rows (sp:
// reduce-scatter in place, own_rows(dfull); else all-reduce, dfull).
Tensor column_input_grad(const ModelDims& d, const TensorParallel& tp, Tensor dfull);

// Row output, forward: where the row-parallel linear writes its partial sum:
// tp.full under sp, `out` itself otherwise.
Tensor row_partial(const ModelDims& d, const TensorParallel& tp, Tensor out);
// Sums the partial outputs into this rank's rows `out` (sp: reduce-scatter
// from `partial`; else all-reduce in place, partial == out).
void row_output(const ModelDims& d, const TensorParallel& tp, Tensor out, Tensor partial);
// Row output, backward: the full-sequence gradient of the row-parallel
// output (sp: all-gather of `dout`'s rows into tp.full; else `dout`).
Tensor row_output_grad(const ModelDims& d, const TensorParallel& tp, Tensor dout);

// Sums a tensor that each rank computed a part of, in place (the combine
// weights' gradient of a MoE layer, whose experts' columns are split).
void sum_over_tp(const TensorParallel& tp, Tensor t);

}  // namespace trainer
