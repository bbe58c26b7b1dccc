// The CUDA module's functions behind core's device memory and device choice
// (the device runtime table, core/cuda_backend.h): kernels/cuda/device_memory.cpp
// and kernels/cuda/device_info.cpp.
#pragma once

#include <cstddef>
#include <string>

#include "core/cuda_backend.h"
#include "core/tensor.h"

namespace trainer::cuda {

std::string describe();
int device_count(std::string* why);
void set_device(int index);
CudaDeviceInfo device_info(int index);

void* alloc(size_t bytes, const std::string& label);
void release(void* p);
void transfer(Tensor dst, Tensor src);

}  // namespace trainer::cuda
