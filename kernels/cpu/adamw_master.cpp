#include <cstring>
#include <stdexcept>

#include "kernels/cpu/cpu_ops.h"

namespace trainer::cpu {

// The CPU is fp32 end to end, so the "low-precision" copy is another F32
// tensor; this twin exists so the CUDA kernel has a reference to test against.
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  if (param.dtype != DType::F32 || param.numel() != master.numel())
    throw std::invalid_argument("adamw_update_master: param " + param.shape_str() + " (" + dtype_name(param.dtype) +
                                ") must be F32 with master's numel " + std::to_string(master.numel()) + " on the CPU");
  cpu::adamw_update(master, grad, m, v, s);
  std::memcpy(param.data, master.data, master.nbytes());
}

void convert(Tensor dst, Tensor src) {
  if (dst.dtype != src.dtype || dst.numel() != src.numel())
    throw std::invalid_argument(std::string("convert: the CPU backend is fp32 only: ") + dtype_name(src.dtype) +
                                src.shape_str() + " -> " + dtype_name(dst.dtype) + dst.shape_str());
  std::memmove(dst.data, src.data, src.nbytes());
}

}  // namespace trainer::cpu
