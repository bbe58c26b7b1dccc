// __syncthreads: the block barrier. Threads that exited count as arrived,
// as a GPU counts exited warps; the last thread to arrive releases the rest
// and goes on itself.
#include "emu/block.h"
#include "emu/sanitizers.h"
#include "emu/simt.h"

namespace trainer::emu {
namespace detail {
namespace {

// The arrivals' writes happen before everything the woken threads do next.
void release_barrier(Block& b) {
  sanitizers::acquire(&b.barrier_sync);
  b.arrived = 0;
  for (SimtThread& t : b.threads)
    if (t.wait == Wait::kBarrier) wake(b, t);
}

}  // namespace

void throw_if_cancelled(const SimtThread& t) {
  if (t.cancel) throw BlockCancelled{};
}

void wake(Block& b, SimtThread& t) {
  sanitizers::release(&t.wake_sync);
  t.wait = Wait::kReady;
  t.group = nullptr;
  b.ready.push(t.linear);
}

void wait_until_woken(SimtThread& t) {
  suspend();
  throw_if_cancelled(t);
  sanitizers::acquire(&t.wake_sync);
}

void barrier_thread_exited(Block& b) {
  ++b.exited;
  if (b.arrived > 0 && b.arrived + b.exited == b.threads.size()) {
    sanitizers::release(&b.barrier_sync);
    release_barrier(b);
  }
}

}  // namespace detail

void sync_threads() {
  detail::SimtThread& t = detail::current_thread("sync_threads");
  sanitizers::IgnoreAccesses ignore;
  detail::throw_if_cancelled(t);
  detail::Block& b = *t.block;
  sanitizers::release(&b.barrier_sync);
  if (++b.arrived + b.exited == b.threads.size()) {
    detail::release_barrier(b);
    return;
  }
  t.wait = detail::Wait::kBarrier;
  detail::wait_until_woken(t);
}

}  // namespace trainer::emu
