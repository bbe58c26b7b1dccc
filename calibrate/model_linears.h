// The matmuls of the configured model, as one rank of the run computes them
// (`trainer calibrate` times them on the run's device): every linear of a
// layer and the head, on one micro-batch's rows (train.micro_batch_size x
// train.seq_len), with the widths tensor parallelism leaves each rank
// (column-parallel outputs and row-parallel inputs / parallel.tp, the
// vocabulary padded to a multiple of it), and a MoE layer's experts at
// uniform routing (each of the E / ep local experts gets ep x N x K / E rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"

namespace trainer {

struct LinearShape {
  std::string name;    // "attn.wq", "mlp.w_down", "head", ...
  int64_t rows = 0;    // tokens
  int64_t in = 0, out = 0;
  double count = 0;    // times per micro-batch in the whole model (layers, experts)
  // One product (forward, or either half of the backward): 2 rows in out.
  double flops() const { return 2.0 * double(rows) * double(in) * double(out); }
};

// Distinct shapes (equal ones merged, their counts added), largest FLOPs first.
std::vector<LinearShape> model_linears(const Config& c);

}  // namespace trainer
