// Shared checks of the reductions (kernels/op_list.h).
#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

void sum_squares(Tensor x) { checks::need_float("sum_squares", "x", x); }

void sum(Tensor x) { checks::need_float("sum", "x", x); }

}  // namespace trainer::op_checks
