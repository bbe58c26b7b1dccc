// Linear layer of the CPU backend (see kernels/op_list.h): OpenBLAS sgemm on
// row-major views, weights stored [OC, IC] as in torch.nn.Linear.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

struct Dims {
  int64_t N, IC, OC;
};

// inp [..., IC], out/dout [..., OC] with the same leading rows, weight [OC, IC]
// (shapes checked by the router, kernels/checks/linear.cpp).
Dims dims(const char* op, const Tensor& inp, const Tensor& weight) {
  const int64_t OC = weight.dim(0), IC = weight.dim(1);
  const int64_t N = inp.numel() / std::max<int64_t>(IC, 1);
  // cblas takes int dimensions.
  if (N > INT_MAX || IC > INT_MAX || OC > INT_MAX)
    checks::fail(op, "inp " + inp.shape_str() + " is too large for a 32-bit BLAS");
  return {N, IC, OC};
}

}  // namespace

void linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) {
  const char* op = "linear_forward";
  need_f32(op, {{"out", &out}, {"inp", &inp}, {"weight", &weight}, {"bias", &bias}});
  const auto [N, IC, OC] = dims(op, inp, weight);
  if (N == 0 || OC == 0) return;
  float* o = out.f32();
  float beta = 0.f;
  if (!bias.empty()) {
    // Seeding out with the bias lets sgemm add it for free (beta = 1).
    const float* b = bias.f32();
#pragma omp parallel for if (N * OC >= kParallelMin)
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + OC, o + n * OC);
    beta = 1.f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(N), int(OC), int(IC), 1.f, inp.f32(),
              int(IC), weight.f32(), int(IC), beta, o, int(OC));
}

void linear_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                     Tensor weight, bool accumulate_dinp) {
  const char* op = "linear_backward";
  need_f32(op, {{"dinp", &dinp},
                {"dweight", &dweight},
                {"dbias", &dbias},
                {"dout", &dout},
                {"inp", &inp},
                {"weight", &weight}});
  const auto [N, IC, OC] = dims(op, inp, weight);
  if (N == 0) return;
  const float* g = dout.f32();
  if (!dinp.empty() && IC > 0) {
    // With OC == 0 sgemm would leave dinp untouched instead of zeroing it.
    if (OC == 0) {
      if (!accumulate_dinp) fill(dinp, 0.f);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(IC), int(OC), 1.f, g,
                  int(OC), weight.f32(), int(IC), accumulate_dinp ? 1.f : 0.f, dinp.f32(), int(IC));
    }
  }
  if (!dweight.empty() && OC > 0 && IC > 0)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(OC), int(IC), int(N), 1.f, g, int(OC),
                inp.f32(), int(IC), 1.f, dweight.f32(), int(IC));
  if (!dbias.empty()) {
    float* db = dbias.f32();
    // Threads own column slabs and walk rows in order: no race, and the sum
    // does not depend on the thread count.
    constexpr int64_t kCols = 64;
    const int64_t blocks = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (N * OC >= kParallelMin && blocks > 1)
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * kCols, c1 = std::min(OC, c0 + kCols);
      double s[kCols] = {};
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = c0; c < c1; ++c) s[c - c0] += g[n * OC + c];
      for (int64_t c = c0; c < c1; ++c) db[c] += float(s[c - c0]);
    }
  }
}

}  // namespace trainer::cpu
