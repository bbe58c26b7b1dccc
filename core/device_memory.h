// Raw memory of either device, for arenas and host<->device transfers. Host
// memory is here; device memory and every copy touching it are the CUDA
// module's (core/cuda_module.h), loaded by the first such request. The
// CPU-only build answers every CUDA request with a clear error.
#pragma once

#include <cstddef>
#include <string>

#include "core/tensor.h"

namespace trainer {

// Zero-filled, 64-byte aligned (host) or cudaMalloc'd (device) memory.
void* device_alloc(size_t bytes, Device d, const std::string& label);
void device_free(void* p, Device d);
// Same dtype and numel; any pair of devices. Ordered on the compute stream;
// returns once a copy to the host has landed and the host source of a copy
// to the device may be reused.
void copy_between_devices(Tensor dst, Tensor src);
// Copies a tensor into a host buffer (for checkpoints, dumps, generation).
void read_to_host(Tensor src, void* host_dst);
void write_from_host(Tensor dst, const void* host_src);

}  // namespace trainer
