// The router: one function per entry of kernels/op_list.h, generated below,
// that sends the call to the backend owning its tensors: kernels/cpu for host
// tensors, kernels/cuda for device tensors (when the CUDA backend is built).
#include "kernels/ops.h"

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device_memory.h"
#include "kernels/cpu/cpu_ops.h"
#ifdef TRAINER_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace trainer::ops {
namespace {

#ifndef TRAINER_HAVE_CUDA
[[noreturn]] void no_cuda(const char* op) {
  throw std::logic_error(std::string(op) +
                         ": a CUDA tensor reached an op, but this build has no CUDA backend");
}
#endif

// The backend is chosen by the first tensor argument that is present: some
// outputs are optional (an empty dinp, dbias), and an absent tensor carries no
// device worth trusting. With none present, the CPU.
struct FirstPresent {
  const Tensor* found = nullptr;
  void take(const Tensor& t) {
    if (!found && !t.empty()) found = &t;
  }
  void take(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) take(t);
  }
  template <typename T>
  void take(const T&) {}
};

template <typename... A>
Device route_device(const A&... a) {
  FirstPresent f;
  (f.take(a), ...);
  return f.found ? f.found->device : Device::CPU;
}

}  // namespace

// What a route does before choosing the backend (op_list.h, "route").
#define TRAINER_BEFORE_device(...)
#define TRAINER_BEFORE_transfer(dst, src) \
  if ((dst).device != (src).device) return copy_between_devices(dst, src);

#ifdef TRAINER_HAVE_CUDA
#define TRAINER_ON_CUDA(name, args) return cuda::name args;
#else
#define TRAINER_ON_CUDA(name, args) no_cuda(#name);
#endif

#define TRAINER_OP(route, ret, name, params, args)         \
  ret name params {                                        \
    TRAINER_BEFORE_##route args                            \
    if (route_device args == Device::CUDA) {               \
      TRAINER_ON_CUDA(name, args)                          \
    }                                                      \
    return cpu::name args;                                 \
  }
#include "kernels/op_list.h"
#undef TRAINER_OP

}  // namespace trainer::ops
