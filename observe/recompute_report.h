// The trade activation recompute offers, as one line of the start-up plan:
// what a rank holds for activations and workspace under each mode, next to
// the mode the run uses, so that choosing it is done on numbers.
#pragma once

#include <string>

#include "comm/mesh.h"
#include "config/config.h"
#include "core/tensor.h"

namespace trainer {

//   "  recompute (activations + workspace): none 2.1 MiB | selective 1.5 MiB | full 0.6 MiB (this run: none)"
std::string format_recompute_trade(const Config& c, DType storage, const MeshShape& mesh, const Coords& at,
                                   int zero_stage);

}  // namespace trainer
