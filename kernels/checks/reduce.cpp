// Shared checks of the reductions (kernels/op_list.h).
#include <stdexcept>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

void sum_squares(Tensor x) { checks::need_float("sum_squares", "x", x); }

void sum(Tensor x) { checks::need_float("sum", "x", x); }

// Any dtype: the bytes are what is compared.
void checksum(Tensor x) {
  if (x.numel() > 0 && !x.data) throw std::invalid_argument("checksum: x" + x.shape_str() + " has no data");
}

}  // namespace trainer::op_checks
