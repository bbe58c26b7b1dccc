// The checks of one tensor's AdamW update, shared by the single-tensor ops
// (checks/adamw.cpp) and the multi-tensor one (checks/adamw_multi.cpp).
#pragma once

#include "kernels/ops.h"

namespace trainer::op_checks::adamw {

void check_step(const char* op, const ops::AdamWStep& s);

// param (any float type) may be master itself (F32); every array has
// master's numel; the arrays are disjoint otherwise.
void check_master_update(const char* op, const Tensor& param, const Tensor& master, const Tensor& grad,
                         const Tensor& m, const Tensor& v);

}  // namespace trainer::op_checks::adamw
