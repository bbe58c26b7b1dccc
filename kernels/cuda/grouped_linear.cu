// Per-expert linear over contiguous row groups (MoE), CUDA backend; semantics
// of ops::grouped_linear_forward/backward (kernels/op_list.h): rows
// [offsets[e], offsets[e+1]) of inp go through weight[e]; rows >= offsets[E]
// are zeroed; dweight accumulates.
//
// Algorithm: the E+1 offsets live on the device (moe_dispatch_plan or an EP
// all-to-all wrote them), so they are copied to the host first. KNOWN COST:
// that copy synchronises the compute stream once per call (forward and
// backward), which stalls the CPU until all queued GPU work is done and
// leaves a launch-latency gap (tens of microseconds) per call. Then one
// cuBLASLt GEMM per non-empty expert, through linear_forward/linear_backward
// (linear.cu) on row slices, so the dtype rules, plan cache and checks are
// those of the dense linear; the tail rows are zeroed with cudaMemsetAsync.
// A device-side grouped GEMM (no sync) can replace this later with the same
// semantics.
//
// Cost: forward 2*rows*OC*IC flops over E GEMMs; backward twice that
// (dinp and dweight). Bytes: inp, out and the weights of non-empty experts
// once per GEMM; E+1 ints device -> host.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"

namespace trainer::cuda {
namespace {

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string(op) + ": " + what);
}

// Shapes arrive checked by the router (kernels/checks/grouped_linear.cpp);
// the dtype rules (those of linear_*) and the offsets' values are checked
// here, before anything runs.

struct Groups {
  int64_t E, OC, IC, rows;
  std::vector<int32_t> off;  // E+1 entries, validated
};

// Reads offsets to the host (synchronises the stream) and validates them:
// they may come from another rank's counts (EP), so a bad one must fail here
// rather than index out of bounds on the device.
Groups read_groups(const char* op, const Tensor& weight, const Tensor& offsets, int64_t rows) {
  Groups g{weight.dim(0), weight.dim(1), weight.dim(2), rows, {}};
  g.off.resize(size_t(g.E + 1));
  CUDA_CHECK(cudaMemcpyAsync(g.off.data(), offsets.data, g.off.size() * sizeof(int32_t), cudaMemcpyDeviceToHost,
                             stream()),
             std::string(op) + ": offsets " + offsets.shape_str() + " to host");
  CUDA_CHECK(cudaStreamSynchronize(stream()), std::string(op) + ": waiting for offsets " + offsets.shape_str());
  bool ok = g.off[0] == 0 && g.off[size_t(g.E)] <= rows;
  for (int64_t e = 0; ok && e < g.E; ++e) ok = g.off[size_t(e)] <= g.off[size_t(e + 1)];
  if (!ok) {
    std::string s;
    for (int64_t e = 0; e <= g.E; ++e) s += (e ? ", " : "") + std::to_string(g.off[size_t(e)]);
    fail(op, "offsets [" + s + "] must start at 0, not decrease, and end at most at the " + std::to_string(rows) +
                 " rows of the input");
  }
  return g;
}

Tensor expert_weight(const Tensor& w, int64_t e) {
  return w.slice0(e, e + 1).view({w.dim(1), w.dim(2)});
}

void zero_tail(const char* op, const char* name, const Tensor& t, int64_t kept) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  if (rows <= kept || cols == 0) return;
  const size_t es = dtype_size(t.dtype);
  CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(t.data) + size_t(kept * cols) * es, 0,
                             size_t((rows - kept) * cols) * es, stream()),
             std::string(op) + ": zero rows [" + std::to_string(kept) + ", " + std::to_string(rows) + ") of " + name +
                 " " + t.shape_str());
}

}  // namespace

void grouped_linear_forward(Tensor out, Tensor inp, Tensor weight, Tensor offsets) {
  const char* op = "grouped_linear_forward";
  // Dtype rules are linear_forward's; checked up front so that nothing runs
  // (and no sync happens) for a call that would fail at the first expert.
  if (inp.dtype != weight.dtype || (out.dtype != inp.dtype && out.dtype != DType::F32))
    fail(op, "inp " + inp.shape_str() + " " + dtype_name(inp.dtype) + ", weight " + weight.shape_str() + " " +
                 dtype_name(weight.dtype) + " and out " + out.shape_str() + " " + dtype_name(out.dtype) +
                 ": inp and weight must share one type, out that type or F32");
  const Groups g = read_groups(op, weight, offsets, inp.dim(0));
  for (int64_t e = 0; e < g.E; ++e) {
    const int64_t r0 = g.off[size_t(e)], r1 = g.off[size_t(e + 1)];
    if (r1 == r0 || g.OC == 0) continue;
    if (g.IC == 0) {  // an empty sum (linear_forward has no rows to infer then)
      const size_t es = dtype_size(out.dtype);
      CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(out.data) + size_t(r0 * g.OC) * es, 0,
                                 size_t((r1 - r0) * g.OC) * es, stream()),
                 std::string(op) + ": out " + out.shape_str() + " with IC = 0");
      continue;
    }
    linear_forward(out.slice0(r0, r1), inp.slice0(r0, r1), expert_weight(weight, e), Tensor());
  }
  zero_tail(op, "out", out, g.off[size_t(g.E)]);
}

void grouped_linear_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor offsets) {
  const char* op = "grouped_linear_backward";
  const int64_t rows = inp.dim(0);
  // Either output may be absent: the first layer of a frozen stack needs no
  // dinp, a frozen expert no dweight.
  const bool want_dinp = !dinp.empty(), want_dw = !dweight.empty();
  const DType t = dout.dtype;
  const bool types_ok = inp.dtype == t && weight.dtype == t &&
                        (!want_dinp || dinp.dtype == t || dinp.dtype == DType::F32) &&
                        (!want_dw || dweight.dtype == t || dweight.dtype == DType::F32);
  if (!types_ok)
    fail(op, std::string("dout ") + dtype_name(t) + ", inp " + dtype_name(inp.dtype) + ", weight " +
                 dtype_name(weight.dtype) + (want_dinp ? std::string(", dinp ") + dtype_name(dinp.dtype) : "") +
                 (want_dw ? std::string(", dweight ") + dtype_name(dweight.dtype) : "") +
                 ": dout, inp and weight must share one type; dinp and dweight that type or F32");
  const Groups g = read_groups(op, weight, offsets, rows);
  if (want_dinp || want_dw) {
    for (int64_t e = 0; e < g.E; ++e) {
      const int64_t r0 = g.off[size_t(e)], r1 = g.off[size_t(e + 1)];
      if (r1 == r0 || g.IC == 0) continue;
      linear_backward(want_dinp ? dinp.slice0(r0, r1) : Tensor(), want_dw ? expert_weight(dweight, e) : Tensor(),
                      Tensor(), dout.slice0(r0, r1), inp.slice0(r0, r1), expert_weight(weight, e),
                      /*accumulate_dinp=*/false);
    }
  }
  if (want_dinp) zero_tail(op, "dinp", dinp, g.off[size_t(g.E)]);
}

}  // namespace trainer::cuda
