// The emulated CUDA device's execution core: kernels compiled with g++ run
// on the CPU with a GPU's SIMT semantics.
//
// launch() runs `body` once per CUDA thread. Every CUDA thread of a block is
// its own fiber (emu/fiber.h), so a thread can stop at __syncthreads or a
// warp operation midway through its code and another can run; a block runs
// on one host thread, blocks on several. Inside a block the threads run in a
// fixed order that is hostile to missing barriers: thread 0 runs until it
// waits or exits, then thread 1, and so on, so a thread that reads shared
// memory before the barrier that should order it reads what the others have
// not written yet. Blocks start in an order shuffled by the seed.
//
// The free functions below are what the kernel code calls (a shim header
// maps threadIdx, __syncthreads, __shfl_sync, ... onto them); called outside
// a kernel they throw. Errors inside a kernel (a bad warp mask, a deadlock, an
// exception of the body) stop the launch and reach launch()'s caller as a
// SimtError naming the kernel, the block and the thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "emu/atomics.h"
#include "emu/dim3.h"
#include "emu/shuffle.h"
#include "emu/warp.h"

namespace trainer::emu {

// The sm_90 per-block shared memory limit (static and dynamic together).
inline constexpr size_t kMaxSharedBytesPerBlock = 227 * 1024;

struct SimtError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LaunchOptions {
  std::string name = "kernel";  // names the kernel in errors
  // Block start order: 0 in order, anything else a shuffle by that seed.
  // Unset: the environment's TRAINER_EMU_SEED, else 0.
  std::optional<uint64_t> seed;
  // Host threads running blocks. 0: the environment's TRAINER_EMU_THREADS,
  // else the hardware's concurrency.
  unsigned host_threads = 0;
  size_t stack_bytes = 64 * 1024;  // per CUDA thread
  // Fresh shared memory is filled with this byte, not zeros, so a kernel
  // reading it before writing it computes with garbage, as on a GPU: 0xFF is
  // a NaN in fp32, bf16 and fp16, and -1 as an integer.
  unsigned char shared_poison = 0xFF;
};

// Runs `body` once per thread of every block of `grid`; returns when all
// have finished. Launch sizes are checked as CUDA checks them.
void launch(Dim3 grid, Dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body,
            const LaunchOptions& options = {});

// The calling CUDA thread's coordinates; the references stay valid for the
// thread's whole life.
const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();
unsigned lane_id();  // linear thread id (x fastest, then y, z) modulo 32

// __syncthreads(): waits until every thread of the block has arrived here or
// exited.
void sync_threads();

// extern __shared__: this block's dynamic shared memory, as many bytes as
// the launch asked for, 16-byte aligned (page-aligned here).
void* dynamic_shared();
size_t dynamic_shared_bytes();
// A statically declared __shared__ variable: this block's instance of the
// declaration identified by `key` (the address of a static object unique to
// the declaration site). Same key, same block: same storage; a new block
// gets fresh storage, filled with the poison byte.
void* block_shared(const void* key, size_t bytes, size_t align);

// Per-CUDA-thread state of later layers (cp.async's queue), found by `key`
// (the address of a static object of the layer): null until set.
void*& thread_slot(const void* key);
// Runs when the calling CUDA thread exits (also when its body threw), on its
// fiber, latest registered first; for finalising what thread_slot holds.
void on_thread_exit(std::function<void()> hook);

}  // namespace trainer::emu
