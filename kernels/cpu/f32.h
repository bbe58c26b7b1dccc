// The CPU backend's own argument check: it computes in fp32 only, so every
// floating-point tensor is F32 (the shared checks, kernels/checks, already
// passed in the router, accept BF16/F16 too). Everything else the CPU checks
// itself is about values it can read on the host (ids, targets, row maps,
// offsets), next to the code that reads them.
#pragma once

#include <initializer_list>
#include <string>
#include <utility>

#include "kernels/checks/check_util.h"

namespace trainer::cpu {

// Absent tensors (no data) are skipped: whether one may be absent is the
// shared check's business.
inline void need_f32(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  for (const auto& [name, t] : ts) {
    if (t->empty() || t->dtype == DType::F32) continue;
    // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) about the
    // inlined operator+ chain here.
    std::string what = name;
    what.append(" ").append(t->shape_str()).append(" is ").append(dtype_name(t->dtype));
    what.append(", expected F32: the CPU backend computes in fp32 only");
    checks::fail(op, what);
  }
}

}  // namespace trainer::cpu
