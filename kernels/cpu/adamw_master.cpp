#include <cstring>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/cpu/cpu_ops.h"

namespace trainer::cpu {

// The CPU is fp32 end to end, so the "low-precision" copy is another F32
// tensor; this twin exists so the CUDA kernel has a reference to test against.
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  if (param.dtype != DType::F32)
    checks::fail("adamw_update_master", "param " + param.shape_str() + " is " + dtype_name(param.dtype) +
                                            ", expected F32: the CPU backend computes in fp32 only");
  cpu::adamw_update(master, grad, m, v, s);
  if (param.data != master.data) std::memcpy(param.data, master.data, master.nbytes());
}

// Same dtype only: the CPU backend holds nothing but F32 (and moves bytes).
void convert(Tensor dst, Tensor src) {
  if (dst.dtype != src.dtype)
    checks::fail("convert", std::string("the CPU backend is fp32 only: ") + dtype_name(src.dtype) +
                                src.shape_str() + " -> " + dtype_name(dst.dtype) + dst.shape_str());
  if (dst.data != src.data && src.nbytes() > 0) std::memmove(dst.data, src.data, src.nbytes());
}

}  // namespace trainer::cpu
