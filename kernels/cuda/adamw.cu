// AdamW of the CUDA backend (semantics: ops::adamw_update and
// ops::adamw_update_master in kernels/op_list.h; arithmetic: kernels/cpu/adamw.cpp,
// torch.optim.AdamW's order, operation by operation).
//
// Algorithm: one fused pass per element, grid-stride over the tensor:
//   g = grad * grad_scale; master *= 1 - lr*wd; m = lerp(m, g, 1 - beta1);
//   v = beta2*v + (1-beta2)*g*g; master -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps);
//   param = round(master) (adamw_update_master only).
// Bias corrections and the other constants are formed on the host in double
// (adamw_detail::make_consts); the per-element math uses explicit
// round-to-nearest intrinsics, so F32 results equal the CPU backend's bit for
// bit. 4 elements per thread step with 16-byte (F32) / 8-byte (BF16/F16) loads
// and stores when all arrays share the same alignment phase (a scalar head
// and tail handle the rest), element by element otherwise.
//
// Bytes per parameter: adamw_update (F32 param and grad) 4+4 param, 4 grad,
// 8 m, 8 v = 28 B; adamw_update_master with BF16 param and grad: 2 grad +
// 8 master + 8 m + 8 v + 2 param = 28 B. About 20 flops (2 divisions, 1 sqrt)
// per element: memory bound.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/adamw_math.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/launch.cuh"

namespace trainer::cuda {
namespace {

using adamw_detail::Consts;

constexpr int kThreads = 256;

template <typename Tp, typename Tg, bool kWriteParam>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(Tp* param, float* master, const Tg* grad, float* m, float* v, int64_t n, int head,
                 double weight_decay, Consts c) {
  // The decay factor as adamw_update_master_multi forms it (same function).
  const float decay = adamw_detail::decay_factor(c.lr, weight_decay);
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nthreads = int64_t(gridDim.x) * blockDim.x;
  adamw_detail::update_range<Tp, Tg, kWriteParam>(param, master, grad, m, v, 0, n, head, decay, c, tid,
                                                  nthreads);
}

unsigned grid_for(int64_t n) {
  const int64_t work = (n + adamw_detail::kVec - 1) / adamw_detail::kVec;  // vector steps
  const int64_t blocks = std::max<int64_t>(1, (work + kThreads - 1) / kThreads);
  return unsigned(std::min<int64_t>(blocks, int64_t(sm_count()) * 8));
}

}  // namespace

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  const char* op = "adamw_update";
  // Dtypes, sizes, the step and disjointness arrive checked by the router
  // (kernels/checks/adamw.cpp).
  const int64_t n = param.numel();
  if (n == 0) return;
  const Consts c = adamw_detail::make_consts(s);
  const std::string ctx = "param " + param.shape_str() + ", grad " + dtype_name(grad.dtype);
  DISPATCH_FLOAT(grad.dtype, Tg, op, {
    using adamw_detail::phase_of;
    const int head = adamw_detail::common_head(
        {phase_of<float>(param.data), phase_of<Tg>(grad.data), phase_of<float>(m.data), phase_of<float>(v.data)});
    launch(adamw_kernel<float, Tg, false>, grid_for(n), kThreads, 0, stream(), nullptr, param.f32(),
           static_cast<const Tg*>(grad.data), m.f32(), v.f32(), n, head, double(s.weight_decay), c);
    KERNEL_CHECK("adamw_kernel", ctx);
  });
}

void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  const char* op = "adamw_update_master";
  const int64_t n = master.numel();
  if (n == 0) return;
  const Consts c = adamw_detail::make_consts(s);
  const std::string ctx = "master " + master.shape_str() + ", param " + dtype_name(param.dtype) + ", grad " +
                          dtype_name(grad.dtype);
  DISPATCH_FLOAT(param.dtype, Tp, op, {
    DISPATCH_FLOAT(grad.dtype, Tg, op, {
      using adamw_detail::phase_of;
      const int head = adamw_detail::common_head({phase_of<Tp>(param.data), phase_of<float>(master.data),
                                                  phase_of<Tg>(grad.data), phase_of<float>(m.data),
                                                  phase_of<float>(v.data)});
      launch(adamw_kernel<Tp, Tg, true>, grid_for(n), kThreads, 0, stream(), static_cast<Tp*>(param.data), master.f32(),
             static_cast<const Tg*>(grad.data), m.f32(), v.f32(), n, head, double(s.weight_decay), c);
      KERNEL_CHECK("adamw_kernel", ctx);
    });
  });
}

}  // namespace trainer::cuda
