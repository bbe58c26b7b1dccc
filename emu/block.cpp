// Runs one thread block on the calling host thread: a fiber per CUDA thread,
// scheduled from the ready queue (emu/block.h says in what order).
#include "emu/block.h"

#include "emu/sanitizers.h"
#include "emu/simt.h"

namespace trainer::emu::detail {
namespace {

void run_body(SimtThread& t) noexcept {
  if (t.cancel) return;
  try {
    (*t.block->kernel->body)();
  } catch (const BlockCancelled&) {
  } catch (const SimtError&) {
    t.error = std::current_exception();
  } catch (const std::exception& e) {
    t.error = std::make_exception_ptr(SimtError(where(t) + ": " + e.what()));
  } catch (...) {
    t.error = std::current_exception();
  }
}

void run_exit_hooks(SimtThread& t) noexcept {
  for (auto hook = t.exit_hooks.rbegin(); hook != t.exit_hooks.rend(); ++hook) {
    try {
      (*hook)();
    } catch (const std::exception& e) {
      if (!t.error) t.error = std::make_exception_ptr(SimtError(where(t) + ": in an exit hook: " + e.what()));
    } catch (...) {
      if (!t.error) t.error = std::current_exception();
    }
  }
  t.exit_hooks.clear();
}

// A CUDA thread's fiber.
void thread_main(void* arg) noexcept {
  SimtThread& t = *static_cast<SimtThread*>(arg);
  run_body(t);
  run_exit_hooks(t);
  sanitizers::IgnoreAccesses ignore;
  Block& b = *t.block;
  if (!b.cancelling) {
    warp_thread_exited(b, t);
    barrier_thread_exited(b);
  }
  sanitizers::release(b.exit_sync);
  t.wait = Wait::kExited;
}

// Every live thread unwinds: resumed once more, it throws BlockCancelled
// from where it waits (or skips its body if it never ran).
void cancel_all(Block& b) {
  if (b.cancelling) return;
  b.cancelling = true;
  b.ready.clear();
  for (WarpGroup*& g : b.open_groups) g = nullptr;
  for (SimtThread& t : b.threads) {
    if (t.wait == Wait::kExited) continue;
    t.cancel = true;
    b.ready.push(t.linear);
  }
}

// Coordinates first: TSan keeps only the name's first 63 characters.
void name_for_tsan(const SimtThread& t) {
  const std::string name = "block " + dim_text(t.block->idx) + " thread " + dim_text(t.idx) + " of kernel '" +
                           t.block->kernel->name + "'";
  t.fiber->name_for_tsan(name.c_str());
}

void set_up(Block& b, const Kernel& kernel, Dim3 block_idx, BlockResources& res) {
  const unsigned n = static_cast<unsigned>(volume(kernel.block));
  b.kernel = &kernel;
  b.idx = block_idx;
  b.shared = &res.shared;
  b.exit_sync = res.exit_sync;
  b.live = n;
  b.open_groups.assign((n + 31) / 32, nullptr);
  res.shared.begin_block(kernel.dynamic_shared_bytes, kernel.poison);
  b.threads.resize(n);
  for (unsigned i = 0; i < n; ++i) {
    SimtThread& t = b.threads[i];
    t.block = &b;
    t.linear = i;
    t.idx = Dim3{i % kernel.block.x, i / kernel.block.x % kernel.block.y, i / (kernel.block.x * kernel.block.y)};
  }
  for (size_t i = 0; i < res.fibers.size(); ++i)
    if (res.fibers[i]->stack_bytes() < kernel.stack_bytes) res.fibers[i] = std::make_unique<Fiber>(kernel.stack_bytes);
  while (res.fibers.size() < n) res.fibers.push_back(std::make_unique<Fiber>(kernel.stack_bytes));
  // Last: under TSan a fiber's creation orders what was written before it.
  for (unsigned i = 0; i < n; ++i) {
    b.threads[i].fiber = res.fibers[i].get();
    b.threads[i].fiber->start(thread_main, &b.threads[i]);
    if (sanitizers::kTsan) name_for_tsan(b.threads[i]);
  }
  b.ready.reset(n);
  for (unsigned i = 0; i < n; ++i) b.ready.push(i);
}

void schedule(Block& b) {
  while (b.live > 0) {
    if (b.ready.empty()) {
      if (b.cancelling)
        throw std::logic_error("emu: kernel '" + b.kernel->name + "': a cancelled CUDA thread waits again " +
                               "instead of unwinding (does the kernel catch (...) and go on?)");
      if (!b.error) b.error = std::make_exception_ptr(SimtError(describe_deadlock(b)));
      cancel_all(b);
    }
    SimtThread& t = b.threads[b.ready.pop()];
    t.wait = Wait::kRunning;
    set_current_thread(&t);
    t.fiber->resume();
    set_current_thread(nullptr);
    if (t.wait != Wait::kExited) continue;
    --b.live;
    if (t.error && !b.error) b.error = t.error;
    if (b.error) cancel_all(b);
  }
}

}  // namespace

void ReadyQueue::reset(unsigned n) {
  ring_.assign(n, 0);
  head_ = size_ = 0;
}

unsigned ReadyQueue::pop() {
  const unsigned thread = ring_[head_];
  if (++head_ == ring_.size()) head_ = 0;
  --size_;
  return thread;
}

void run_block(const Kernel& kernel, Dim3 block_idx, BlockResources& resources) {
  sanitizers::IgnoreAccesses ignore;  // the scheduler's bookkeeping is not the kernel's memory
  Block b;
  set_up(b, kernel, block_idx, resources);
  schedule(b);
  if (b.error) std::rethrow_exception(b.error);
}

}  // namespace trainer::emu::detail
