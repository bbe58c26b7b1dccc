// One thread block while it runs on a host thread (internal to emu/): its
// CUDA threads with their fibers and wait states, the queue of threads ready
// to run, the barrier, the warps' pending collectives and the shared memory.
//
// Scheduling: the ready queue starts as threads 0..n-1; the host thread
// resumes the front thread, which runs until it waits (barrier, warp
// rendezvous) or exits. The thread that completes a rendezvous wakes the
// others (they join the back of the queue in thread order) and goes on
// itself. The queue empty while threads live means they all wait on one
// another: a deadlock, reported with what each waits for. An error in any
// thread cancels the others: each is resumed once more and unwinds.
#pragma once

#include <cstdint>
#include <exception>
#include <forward_list>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "emu/dim3.h"
#include "emu/fiber.h"
#include "emu/shared_memory.h"
#include "emu/warp.h"

namespace trainer::emu::detail {

// What all blocks of one launch share.
struct Kernel {
  const std::function<void()>* body = nullptr;
  Dim3 grid, block;
  size_t dynamic_shared_bytes = 0;
  std::string name;
  size_t stack_bytes = 0;
  unsigned char poison = 0xFF;
};

enum class Wait : uint8_t { kReady, kRunning, kBarrier, kWarp, kExited };

// A warp collective waiting for lanes; lives on the stack of the lane that
// opened it, which waits until the collective completes.
struct WarpGroup {
  unsigned mask = 0;
  unsigned arrived = 0;
  CollectiveOp op{};
  // Left uninitialised: every lane opens one on its stack in case it is the
  // first, and only the arrived lanes' entries are ever read.
  const void* ins[32];
  void* outs[32];
  WarpGroup* next = nullptr;  // the warp's list of open collectives
};

struct Block;

struct SimtThread {
  Block* block = nullptr;
  Dim3 idx;
  unsigned linear = 0;
  Wait wait = Wait::kReady;
  bool cancel = false;  // unwind at the next wait: the block stops
  WarpGroup* group = nullptr;  // while wait == kWarp
  Fiber* fiber = nullptr;
  std::forward_list<std::pair<const void*, void*>> slots;
  std::vector<std::function<void()>> exit_hooks;
  std::exception_ptr error;
  char wake_sync = 0;  // TSan: the waker releases here, the woken thread acquires
};

// Threads that may run, in the order they will; each thread is in it at
// most once, so n entries suffice.
class ReadyQueue {
 public:
  void reset(unsigned n);
  void push(unsigned thread) {
    size_t at = head_ + size_++;
    if (at >= ring_.size()) at -= ring_.size();
    ring_[at] = thread;
  }
  unsigned pop();
  bool empty() const { return size_ == 0; }
  void clear() { head_ = size_ = 0; }

 private:
  std::vector<unsigned> ring_;
  size_t head_ = 0, size_ = 0;
};

struct Block {
  const Kernel* kernel = nullptr;
  Dim3 idx;
  std::vector<SimtThread> threads;
  ReadyQueue ready;
  unsigned live = 0;     // threads not exited
  unsigned arrived = 0;  // at the barrier, this generation
  unsigned exited = 0;
  char barrier_sync = 0;  // TSan: arrivals release here, the completer acquires
  std::vector<WarpGroup*> open_groups;  // per warp
  SharedArena* shared = nullptr;
  void* exit_sync = nullptr;  // TSan: every thread releases here when it exits
  bool cancelling = false;
  std::exception_ptr error;
};

// Fibers and shared memory of one host thread, reused block after block.
struct BlockResources {
  std::vector<std::unique_ptr<Fiber>> fibers;
  SharedArena shared;
  void* exit_sync = nullptr;
};

// Runs one block to its end; throws its first error.
void run_block(const Kernel& kernel, Dim3 block_idx, BlockResources& resources);

// Helpers of the barrier, the warps and the scheduler.
SimtThread& current_thread(const char* api);
void set_current_thread(SimtThread* thread);
std::string where(const SimtThread& t);
std::string dim_text(const Dim3& d);  // "(x,y,z)"
[[noreturn]] void fail(const SimtThread& t, const std::string& message);
void throw_if_cancelled(const SimtThread& t);
void wait_until_woken(SimtThread& t);  // suspends; unwinds if cancelled meanwhile
void wake(Block& b, SimtThread& t);
void barrier_thread_exited(Block& b);
void warp_thread_exited(Block& b, SimtThread& t);
std::string describe_deadlock(const Block& b);
std::string lane_list(unsigned lanes);  // "0-15, 17"

// Thrown into a cancelled thread's stack so that its frames unwind; not a
// std::exception, so kernel code catching those does not swallow it.
struct BlockCancelled {};

}  // namespace trainer::emu::detail
