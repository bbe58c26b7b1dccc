// The CPU reference backend: fp32, OpenBLAS for matmuls, OpenMP across rows.
// Its functions are those of kernels/op_list.h (semantics documented there),
// declared here from that list.
#pragma once

#include "kernels/ops.h"

namespace trainer::cpu {

using ops::AdamWStep;
using ops::Rope;

#define TRAINER_OP(route, ret, name, params, args) ret name params;
#include "kernels/op_list.h"
#undef TRAINER_OP

}  // namespace trainer::cpu
