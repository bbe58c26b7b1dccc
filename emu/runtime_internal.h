// What the emulated CUDA runtime's files (emu/runtime_*.cpp) share: the
// error state, the allocation table with its guard zones, the device's
// size and the streams' order. Not for kernels or module code, which call
// the CUDA runtime API itself.
//
// Every operation runs on the calling host thread when it is issued, so
// a stream's work is done, in order, by the time the call returns: events
// are complete once recorded and synchronisation has nothing to wait for.
// Operations on one stream from several host threads take the stream's lock,
// so they still run one at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <string>

namespace trainer::emu::runtime {

// ---- errors (runtime_errors.cpp) --------------------------------------------
// Records `code` as this host thread's last error (cudaGetLastError) with the
// emulator's explanation, which cudaGetErrorString(code) then appends;
// returns code.
cudaError_t fail(cudaError_t code, const std::string& detail);
// The same for an error that corrupts the context, as a kernel fault does on
// a GPU: every later call that touches the device returns it (cudaGetLastError
// does not clear it). Printed to stderr once, since the call that reports it
// may be an unrelated one.
cudaError_t fault(cudaError_t code, const std::string& detail);
// The sticky error, or cudaSuccess.
cudaError_t sticky_error();

// ---- memory (runtime_memory.cpp) --------------------------------------------
// Whether [p, p + bytes) lies inside one live allocation of this runtime;
// *why says what is wrong otherwise ("... is not device memory", "... runs
// 12 bytes past the end of the 4096-byte allocation at ...").
bool inside_allocation(const void* p, size_t bytes, std::string* why);
// Whether p points into a live allocation at all (cudaMemcpyDefault's guess).
bool is_allocated(const void* p);
// After a kernel: every live allocation's guard zones still hold their
// pattern, else a sticky cudaErrorIllegalAddress naming the kernel and the
// allocation (without AddressSanitizer, which reports such writes itself).
cudaError_t check_guards_after(const std::string& kernel);

// ---- the device (runtime_device.cpp) ----------------------------------------
// The emulated device's memory: what the host had available (MemAvailable)
// when first asked.
size_t device_total_bytes();

// ---- streams (runtime_streams.cpp) ------------------------------------------
// Whether `stream` is the legacy or per-thread default stream or a live
// stream of this runtime.
bool valid_stream(cudaStream_t stream);
// Held while an operation runs on `stream`.
std::unique_lock<std::mutex> lock_stream(cudaStream_t stream);

// ---- the kernel profile (runtime_profile.cpp) --------------------------------
// Whether TRAINER_EMU_PROFILE asks for kernel times (printed at exit).
bool profiling();
void record_launch(const std::string& kernel, double seconds);

}  // namespace trainer::emu::runtime
