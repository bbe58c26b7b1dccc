// What kernel code asks of its CUDA thread: coordinates, shared memory,
// per-thread slots and exit hooks; and the errors that name the thread.
#include "emu/simt.h"

#include <string>

#include "emu/block.h"
#include "emu/sanitizers.h"

namespace trainer::emu {
namespace detail {
namespace {

thread_local SimtThread* t_current = nullptr;

}  // namespace

std::string dim_text(const Dim3& d) {
  // Appended piece by piece: g++ 12 warns (-Wrestrict, wrongly) on "(" + std::string.
  std::string text(1, '(');
  text += std::to_string(d.x);
  text += ',';
  text += std::to_string(d.y);
  text += ',';
  text += std::to_string(d.z);
  text += ')';
  return text;
}

SimtThread& current_thread(const char* api) {
  if (!t_current)
    throw std::logic_error(std::string("trainer::emu::") + api +
                           "() called outside a kernel: only code that trainer::emu::launch runs has a CUDA thread");
  return *t_current;
}

void set_current_thread(SimtThread* thread) { t_current = thread; }

std::string where(const SimtThread& t) {
  return "kernel '" + t.block->kernel->name + "' block " + dim_text(t.block->idx) + " thread " + dim_text(t.idx);
}

void fail(const SimtThread& t, const std::string& message) { throw SimtError(where(t) + ": " + message); }

void fail_in_kernel(const std::string& message) { fail(current_thread("fail_in_kernel"), message); }

}  // namespace detail

using detail::current_thread;

const Dim3& thread_idx() { return current_thread("thread_idx").idx; }
const Dim3& block_idx() { return current_thread("block_idx").block->idx; }
const Dim3& block_dim() { return current_thread("block_dim").block->kernel->block; }
const Dim3& grid_dim() { return current_thread("grid_dim").block->kernel->grid; }
unsigned lane_id() { return current_thread("lane_id").linear % 32; }

void* dynamic_shared() { return current_thread("dynamic_shared").block->shared->dynamic(); }

size_t dynamic_shared_bytes() { return current_thread("dynamic_shared_bytes").block->shared->dynamic_bytes(); }

void* block_shared(const void* key, size_t bytes, size_t align) {
  detail::SimtThread& t = current_thread("block_shared");
  sanitizers::IgnoreAccesses ignore;
  try {
    return t.block->shared->statics(key, bytes, align);
  } catch (const std::runtime_error& e) {
    detail::fail(t, e.what());
  }
}

void*& thread_slot(const void* key) {
  detail::SimtThread& t = current_thread("thread_slot");
  for (auto& [k, value] : t.slots)
    if (k == key) return value;
  t.slots.emplace_front(key, nullptr);
  return t.slots.front().second;
}

void on_thread_exit(std::function<void()> hook) { current_thread("on_thread_exit").exit_hooks.push_back(std::move(hook)); }

}  // namespace trainer::emu
