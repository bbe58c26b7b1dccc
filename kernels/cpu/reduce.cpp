#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {

// Summed in double so that a loss over many tokens does not depend on the
// order fp32 partial sums would take.
double sum(Tensor x) {
  need_f32("sum", {{"x", &x}});
  const float* p = x.f32();
  const int64_t n = x.numel();
  double s = 0;
#pragma omp parallel for reduction(+ : s) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

}  // namespace trainer::cpu
