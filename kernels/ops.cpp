// The router: one function per entry of kernels/op_list.h, generated below,
// that sends the call to the backend owning its tensors: kernels/cpu for host
// tensors, kernels/cuda for device tensors (when the CUDA backend is built),
// through the CUDA module's ops table (kernels/cuda_ops_table.h), fetched on
// first use.
#include "kernels/ops.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "core/device_memory.h"
#include "kernels/checks/op_checks.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda_ops_table.h"

namespace trainer::ops {
namespace {

#ifdef TRAINER_HAVE_CUDA
// A CUDA tensor exists only once device memory loaded the module, and the
// device choice checked this table too (runtime/device_select.cpp), so this
// fails only for tensors made by hand (and then says why).
const CudaOpsTable& cuda_ops(const char* op) {
  std::string why;
  if (const CudaOpsTable* t = cuda_ops_table(&why)) return *t;
  throw std::runtime_error(std::string(op) + ": a CUDA tensor reached an op, but " + why);
}
#else
[[noreturn]] void no_cuda(const char* op) {
  throw std::logic_error(std::string(op) +
                         ": a CUDA tensor reached an op, but this build has no CUDA backend");
}
#endif

// The names of an op's arguments, from its stringized argument list
// "(out, inp, theta)", for messages.
std::vector<std::string> arg_names(const char* list) {
  std::vector<std::string> names(1);
  for (const char* c = list; *c; ++c) {
    if (*c == ',')
      names.emplace_back();
    else if (*c != '(' && *c != ')' && *c != ' ')
      names.back() += *c;
  }
  return names;
}

// The backend is chosen by the first tensor argument that is present: some
// outputs are optional (an empty dinp, dbias), and an absent tensor carries no
// device worth trusting. With none present, the CPU. Every other present
// tensor must be on the same device: a backend dereferences them all.
class RouteDevice {
 public:
  RouteDevice(const char* op, const std::vector<std::string>& names) : op_(op), names_(names) {}

  template <typename... A>
  Device of(const A&... a) {
    size_t i = 0;
    (take(a, i < names_.size() ? names_[i++] : std::string("?")), ...);
    return first_ ? first_->device : Device::CPU;
  }
  bool any_cuda() const { return any_cuda_; }
  void require_one_device() const {
    if (!mismatch_.empty()) throw std::invalid_argument(std::string(op_) + ": " + mismatch_);
  }

 private:
  void take(const Tensor& t, const std::string& name) {
    if (t.empty()) return;
    any_cuda_ = any_cuda_ || t.device == Device::CUDA;
    if (!first_) {
      first_ = &t;
      first_name_ = name;
    } else if (t.device != first_->device && mismatch_.empty()) {
      mismatch_ = name + " " + t.shape_str() + " is on the " + device_name(t.device) + ", but " +
                  first_name_ + " " + first_->shape_str() + " is on the " +
                  device_name(first_->device) + ": one device per call";
    }
  }
  void take(const std::vector<Tensor>& ts, const std::string& name) {
    for (size_t i = 0; i < ts.size(); ++i) take(ts[i], name + "[" + std::to_string(i) + "]");
  }
  template <typename T>
  void take(const T&, const std::string&) {}

  const char* op_;
  const std::vector<std::string>& names_;
  const Tensor* first_ = nullptr;
  std::string first_name_, mismatch_;
  bool any_cuda_ = false;
};

}  // namespace

// What a route does before choosing the backend (op_list.h, "route").
#define TRAINER_BEFORE_device(...)
#define TRAINER_BEFORE_transfer(dst, src) \
  if ((dst).device != (src).device) return copy_between_devices(dst, src);

#ifdef TRAINER_HAVE_CUDA
#define TRAINER_REFUSE_CUDA(name, route)
#define TRAINER_ON_CUDA(name, args) return cuda_ops(#name).name args;
#else
// Any CUDA tensor, first or not: the clearest thing to say in this build.
#define TRAINER_REFUSE_CUDA(name, route) \
  if ((route).any_cuda()) no_cuda(#name);
#define TRAINER_ON_CUDA(name, args) no_cuda(#name);
#endif

// Device first (so that a CUDA tensor in a CPU-only build is refused as
// such), then the checks both backends share, then the backend.
#define TRAINER_OP(route, ret, name, params, args)                  \
  ret name params {                                                 \
    TRAINER_BEFORE_##route args                                     \
    static const std::vector<std::string> names = arg_names(#args); \
    RouteDevice on(#name, names);                                   \
    const Device device = on.of args;                               \
    TRAINER_REFUSE_CUDA(name, on)                                   \
    on.require_one_device();                                        \
    op_checks::name args;                                           \
    if (device == Device::CUDA) {                                   \
      TRAINER_ON_CUDA(name, args)                                   \
    }                                                               \
    return cpu::name args;                                          \
  }
#include "kernels/op_list.h"
#undef TRAINER_OP

}  // namespace trainer::ops
