// Per-expert linear over contiguous row groups, CPU reference. One sgemm per
// non-empty expert; OpenBLAS threads inside each call, so the expert loop
// stays serial rather than nesting OpenMP over a threaded BLAS.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

using checks::fail;

struct Groups {
  int64_t E, OC, IC, rows;
  std::vector<int64_t> off;  // E+1 entries, validated
};

// weight [E,OC,IC], offsets [E+1] (shapes checked by the router,
// kernels/checks/grouped_linear.cpp) with 0 = off[0] <= ... <= off[E] <= rows.
// Offsets may come from another rank's counts (EP), so their values are
// checked before any row is touched.
Groups check_groups(const char* op, const Tensor& weight, const Tensor& offsets, int64_t rows) {
  Groups g{weight.dim(0), weight.dim(1), weight.dim(2), rows, {}};
  const int32_t* o = offsets.i32();
  g.off.assign(o, o + g.E + 1);
  bool ok = g.off[0] == 0 && g.off[size_t(g.E)] <= rows;
  for (int64_t e = 0; ok && e < g.E; ++e) ok = g.off[size_t(e)] <= g.off[size_t(e + 1)];
  if (!ok) {
    std::string s;
    for (int64_t e = 0; e <= g.E; ++e) s += (e ? ", " : "") + std::to_string(g.off[size_t(e)]);
    fail(op, "offsets [" + s + "] must start at 0, not decrease, and end at most at the " +
                 std::to_string(rows) + " rows of the input");
  }
  return g;
}

}  // namespace

void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets) {
  const char* op = "grouped_linear_forward";
  need_f32(op, {{"out", &out}, {"inp", &inp}, {"weight", &weight}});
  const Groups g = check_groups(op, weight, offsets, inp.dim(0));
  const float* X = inp.f32();
  const float* Wt = weight.f32();
  float* Y = out.f32();
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[size_t(e)], m = g.off[size_t(e + 1)] - r0;
    if (m == 0 || g.OC == 0) continue;
    if (g.IC == 0) {  // an empty sum; not every BLAS writes C when k = 0
      std::memset(Y + r0 * g.OC, 0, size_t(m * g.OC) * sizeof(float));
      continue;
    }
    // out_e [m,OC] = inp_e [m,IC] @ W_e^T, W_e stored [OC,IC] row-major.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(g.OC), int(g.IC), 1.f,
                X + r0 * g.IC, int(g.IC), Wt + e * g.OC * g.IC, int(g.IC), 0.f, Y + r0 * g.OC,
                int(g.OC));
  }
  const int64_t kept = g.off[size_t(g.E)];
  // Tail rows are capacity padding; zero them so they hold no stale data.
  if (g.rows > kept)
    std::memset(Y + kept * g.OC, 0, size_t((g.rows - kept) * g.OC) * sizeof(float));
}

void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight,
                             Tensor offsets) {
  const char* op = "grouped_linear_backward";
  need_f32(op, {{"dinp", &dinp}, {"dweight", &dweight}, {"dout", &dout}, {"inp", &inp}, {"weight", &weight}});
  const Groups g = check_groups(op, weight, offsets, inp.dim(0));
  // Either output may be absent: the first layer of a frozen stack needs no
  // dinp, and a frozen expert needs no dweight.
  const bool want_dinp = !dinp.empty(), want_dw = !dweight.empty();
  const float* X = inp.f32();
  const float* Wt = weight.f32();
  const float* G = dout.f32();
  const int ldx = int(std::max<int64_t>(g.IC, 1)), ldg = int(std::max<int64_t>(g.OC, 1));
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[size_t(e)], m = g.off[size_t(e + 1)] - r0;
    if (m == 0 || g.IC == 0) continue;
    if (want_dinp && g.OC == 0)  // an empty sum; not every BLAS writes C when k = 0
      std::memset(dinp.f32() + r0 * g.IC, 0, size_t(m * g.IC) * sizeof(float));
    else if (want_dinp)  // dinp_e [m,IC] = dout_e [m,OC] @ W_e [OC,IC]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(m), int(g.IC), int(g.OC), 1.f,
                  G + r0 * g.OC, ldg, Wt + e * g.OC * g.IC, ldx, 0.f, dinp.f32() + r0 * g.IC, ldx);
    if (want_dw && g.OC > 0)  // dW_e [OC,IC] += dout_e^T [OC,m] @ inp_e [m,IC]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(g.OC), int(g.IC), int(m), 1.f,
                  G + r0 * g.OC, ldg, X + r0 * g.IC, ldx, 1.f, dweight.f32() + e * g.OC * g.IC,
                  ldx);
  }
  if (want_dinp) {
    const int64_t kept = g.off[size_t(g.E)];
    if (g.rows > kept)
      std::memset(dinp.f32() + kept * g.IC, 0, size_t((g.rows - kept) * g.IC) * sizeof(float));
  }
}

}  // namespace trainer::cpu
