// The argument checks both backends share, one function per op of
// kernels/op_list.h with the op's own parameters, declared here from that
// list and defined in kernels/checks/<family>.cpp. The router (ops.cpp) runs
// an op's check once, after choosing the device and before the backend; a
// backend checks only what is its own (the CPU: F32 storage and host-side
// values such as ids; CUDA: which storage types combine, launch limits).
#pragma once

#include "kernels/ops.h"

namespace trainer::op_checks {

using ops::AdamWStep;
using ops::Rope;

#define TRAINER_OP(route, ret, name, params, args) void name params;
#include "kernels/op_list.h"
#undef TRAINER_OP

}  // namespace trainer::op_checks
