// Cooperative user-mode contexts (fibers) for x86-64 Linux.
//
// The SIMT executor runs every CUDA thread of a block as a fiber and switches
// between them at each barrier and warp operation: hundreds of thousands of
// switches per kernel. ucontext's swapcontext saves and restores the signal
// mask with a system call each time; the switch here is a few instructions
// (the callee-saved registers, the stack pointer, MXCSR and the x87 control
// word), so a switch costs about as much as a function call.
//
// The model is asymmetric: a host thread resume()s a fiber, which runs until
// it calls suspend() (back to that host thread) or its entry returns. Fibers
// never move between host threads. Entries must not throw: an exception
// escaping one would have no frame to unwind into.
#pragma once

#include <cstddef>

#include "emu/fiber_stack.h"

namespace trainer::emu {

inline constexpr size_t kDefaultFiberStackBytes = 64 * 1024;

class Fiber {
 public:
  using Entry = void (*)(void* arg) noexcept;

  explicit Fiber(size_t stack_bytes = kDefaultFiberStackBytes);
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Arms the fiber to run entry(arg) from the top of its stack at the next
  // resume(). Not while it is suspended midway: its frames would be dropped
  // without their destructors.
  void start(Entry entry, void* arg);
  // Runs the fiber on this host thread until it suspends or its entry returns.
  void resume();

  // Names the started fiber in ThreadSanitizer's reports (nothing without).
  void name_for_tsan(const char* name);

  bool finished() const { return state_ == State::kFinished; }
  bool suspended() const { return state_ == State::kSuspended; }
  size_t stack_bytes() const { return stack_.bytes; }

 private:
  enum class State { kIdle, kStarted, kRunning, kSuspended, kFinished };

  [[noreturn]] static void main(Fiber* self) noexcept;
  friend void suspend();

  FiberStack stack_;
  void* sp_ = nullptr;  // the saved stack pointer; the registers lie on the stack above it
  Entry entry_ = nullptr;
  void* arg_ = nullptr;
  State state_ = State::kIdle;
  void* tsan_fiber_ = nullptr;
};

// From inside a fiber: back to the host thread that resumed it; returns when
// the fiber is resumed again.
void suspend();

// Whether the caller runs on a fiber (false on a host thread's own stack).
bool on_fiber();

}  // namespace trainer::emu
