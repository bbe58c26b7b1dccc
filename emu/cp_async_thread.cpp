// Each CUDA thread's cp.async queue lives in its thread slot and is drained
// by its exit hook. Copies still pending at exit land then, as hardware
// would carry them out; only the first thread of the process that leaves
// any is reported, since a kernel that forgets a wait does so in every
// thread of every launch.
#include <atomic>
#include <cstdio>
#include <string>

#include "emu/block.h"
#include "emu/ptx_lane.h"
#include "emu/simt.h"

namespace trainer::emu {
namespace {

const char kQueueKey = 0;
std::atomic<bool> g_reported{false};

// On the exiting thread's fiber, which is still the current CUDA thread.
void report_unwaited(size_t copies) {
  if (g_reported.exchange(true)) return;
  const std::string thread = detail::where(detail::current_thread("thread_cp_async_queue"));
  std::fprintf(stderr,
               "emulated CUDA device: %s exited with %zu cp.async cop%s it never waited for "
               "(cp.async.wait_group); they landed at its exit, and reading them before a wait is a race "
               "(reported once per process)\n",
               thread.c_str(), copies, copies == 1 ? "y" : "ies");
}

}  // namespace

CpAsyncQueue& thread_cp_async_queue() {
  void*& slot = thread_slot(&kQueueKey);
  if (!slot) {
    auto* queue = new CpAsyncQueue;
    slot = queue;
    on_thread_exit([queue] {
      const size_t unwaited = queue->drain();
      delete queue;
      if (unwaited > 0) report_unwaited(unwaited);
    });
  }
  return *static_cast<CpAsyncQueue*>(slot);
}

}  // namespace trainer::emu
