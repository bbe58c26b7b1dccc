// The sanitizer annotations the fibers and the SIMT executor need, compiled
// to nothing unless the build has AddressSanitizer or ThreadSanitizer.
//
// ASan must be told which stack is live, or it reports the fibers' stacks as
// wild accesses and unwinds exceptions over the wrong memory. TSan must see
// each CUDA thread as its own thread (a fiber switched without
// synchronisation), so that two CUDA threads touching shared memory without a
// barrier between them are reported as a race; the emulator's own
// bookkeeping, which every CUDA thread of a block touches, is hidden from it
// (IgnoreAccesses) and replaced by explicit happens-before edges where the
// GPU has them (barriers, warp rendezvous, the end of the kernel).
#pragma once

#include <cstddef>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TRAINER_EMU_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define TRAINER_EMU_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(TRAINER_EMU_ASAN)
#define TRAINER_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(TRAINER_EMU_TSAN)
#define TRAINER_EMU_TSAN 1
#endif

#if defined(TRAINER_EMU_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(TRAINER_EMU_TSAN)
#include <sanitizer/tsan_interface.h>
// Exported by libtsan (what OpenMP runtimes use) but not in its header.
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace trainer::emu::sanitizers {

#if defined(TRAINER_EMU_TSAN)
inline constexpr bool kTsan = true;
#else
inline constexpr bool kTsan = false;
#endif

// ASan: the stack about to run is [bottom, bottom + size); `fake_stack` is
// null when the fiber being left will never run again.
inline void start_switch(void** fake_stack, const void* bottom, size_t size) {
#if defined(TRAINER_EMU_ASAN)
  __sanitizer_start_switch_fiber(fake_stack, bottom, size);
#else
  (void)fake_stack, (void)bottom, (void)size;
#endif
}

inline void finish_switch(void* fake_stack, const void** old_bottom, size_t* old_size) {
#if defined(TRAINER_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake_stack, old_bottom, old_size);
#else
  (void)fake_stack, (void)old_bottom, (void)old_size;
#endif
}

// A reused stack still carries the redzones of frames that never returned.
inline void unpoison(void* p, size_t bytes) {
#if defined(TRAINER_EMU_ASAN)
  __asan_unpoison_memory_region(p, bytes);
#else
  (void)p, (void)bytes;
#endif
}

inline void* current_fiber() {
#if defined(TRAINER_EMU_TSAN)
  return __tsan_get_current_fiber();
#else
  return nullptr;
#endif
}

inline void* create_fiber() {
#if defined(TRAINER_EMU_TSAN)
  return __tsan_create_fiber(0);
#else
  return nullptr;
#endif
}

inline void destroy_fiber(void* fiber) {
#if defined(TRAINER_EMU_TSAN)
  if (fiber) __tsan_destroy_fiber(fiber);
#else
  (void)fiber;
#endif
}

// What TSan's reports call the fiber (it keeps the first 63 characters).
inline void name_fiber(void* fiber, const char* name) {
#if defined(TRAINER_EMU_TSAN)
  if (fiber) __tsan_set_fiber_name(fiber, name);
#else
  (void)fiber, (void)name;
#endif
}

// No synchronisation: CUDA threads are ordered only by the emulator's
// explicit edges below, never by the mere fact that one ran after another.
inline void switch_to_fiber(void* fiber) {
#if defined(TRAINER_EMU_TSAN)
  __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
#else
  (void)fiber;
#endif
}

// What this thread did so far happens before whatever acquires `sync` later.
inline void release(void* sync) {
#if defined(TRAINER_EMU_TSAN)
  __tsan_release(sync);
#else
  (void)sync;
#endif
}

inline void acquire(void* sync) {
#if defined(TRAINER_EMU_TSAN)
  __tsan_acquire(sync);
#else
  (void)sync;
#endif
}

// TSan does not see the memory accesses in this scope (per fiber: a scope
// left open across a switch stays open for that fiber alone).
class IgnoreAccesses {
 public:
  IgnoreAccesses() {
#if defined(TRAINER_EMU_TSAN)
    __tsan_ignore_thread_begin();
#endif
  }
  ~IgnoreAccesses() {
#if defined(TRAINER_EMU_TSAN)
    __tsan_ignore_thread_end();
#endif
  }
  IgnoreAccesses(const IgnoreAccesses&) = delete;
  IgnoreAccesses& operator=(const IgnoreAccesses&) = delete;
};

// Inside an IgnoreAccesses scope: TSan sees this scope's accesses again.
class SeeAccesses {
 public:
  SeeAccesses() {
#if defined(TRAINER_EMU_TSAN)
    __tsan_ignore_thread_end();
#endif
  }
  ~SeeAccesses() {
#if defined(TRAINER_EMU_TSAN)
    __tsan_ignore_thread_begin();
#endif
  }
  SeeAccesses(const SeeAccesses&) = delete;
  SeeAccesses& operator=(const SeeAccesses&) = delete;
};

}  // namespace trainer::emu::sanitizers
