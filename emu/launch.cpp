// launch(): checks the launch as CUDA does, deals the blocks, in an order
// shuffled by the seed, to host threads, and hands the first error back.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "emu/block.h"
#include "emu/sanitizers.h"
#include "emu/simt.h"

namespace trainer::emu {
namespace {

// Blocks a shuffled order may hold (8 bytes each).
constexpr unsigned long long kMaxShuffledBlocks = 1ull << 26;

void check_launch(const std::string& name, Dim3 grid, Dim3 block, size_t dynamic_bytes) {
  const std::string at = "launch of kernel '" + name + "': ";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0)
    throw SimtError(at + "grid " + detail::dim_text(grid) + " has a zero extent");
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    throw SimtError(at + "grid " + detail::dim_text(grid) + " exceeds CUDA's (2147483647,65535,65535)");
  if (block.x == 0 || block.y == 0 || block.z == 0)
    throw SimtError(at + "block " + detail::dim_text(block) + " has a zero extent");
  if (block.x > 1024 || block.y > 1024 || block.z > 64)
    throw SimtError(at + "block " + detail::dim_text(block) + " exceeds CUDA's (1024,1024,64)");
  if (volume(block) > 1024)
    throw SimtError(at + "block " + detail::dim_text(block) + " has " + std::to_string(volume(block)) +
                    " threads; a block has at most 1024");
  if (dynamic_bytes > kMaxSharedBytesPerBlock)
    throw SimtError(at + std::to_string(dynamic_bytes) + " bytes of dynamic shared memory exceed the " +
                    std::to_string(kMaxSharedBytesPerBlock) + " (227 KiB) a block may have");
}

unsigned long long env_number(const char* name, unsigned long long fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (*end != '\0' || text[0] == '-')
    throw SimtError(std::string(name) + "='" + text + "' is not a non-negative integer");
  return value;
}

unsigned host_threads_of(const LaunchOptions& options) {
  if (options.host_threads > 0) return options.host_threads;
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const unsigned long long n = env_number("TRAINER_EMU_THREADS", hardware);
  if (n == 0 || n > 4096) throw SimtError("TRAINER_EMU_THREADS=" + std::to_string(n) + " is not from 1 to 4096");
  return static_cast<unsigned>(n);
}

uint64_t next_random(uint64_t& state) {  // splitmix64: the same order on every platform
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Empty for seed 0 (in order); else a Fisher-Yates shuffle of 0..count-1.
std::vector<uint64_t> block_order(unsigned long long count, uint64_t seed, const std::string& name) {
  if (seed == 0) return {};
  if (count > kMaxShuffledBlocks)
    throw SimtError("launch of kernel '" + name + "': " + std::to_string(count) +
                    " blocks are too many to shuffle (seed " + std::to_string(seed) + "); launch with seed 0");
  std::vector<uint64_t> order(count);
  for (uint64_t i = 0; i < count; ++i) order[i] = i;
  uint64_t state = seed;
  for (uint64_t i = count; i > 1; --i) std::swap(order[i - 1], order[next_random(state) % i]);
  return order;
}

struct alignas(64) SyncObject {
  char byte = 0;
};

struct LaunchState {
  const detail::Kernel* kernel = nullptr;
  std::vector<uint64_t> order;
  unsigned long long count = 0;
  std::atomic<unsigned long long> next{0};
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::exception_ptr error;
  std::vector<SyncObject> exit_syncs;  // TSan: one per host thread
};

void run_worker(LaunchState& s, unsigned worker) {
  detail::BlockResources resources;
  resources.exit_sync = &s.exit_syncs[worker];
  const Dim3 g = s.kernel->grid;
  try {
    while (!s.stop.load(std::memory_order_relaxed)) {
      const unsigned long long i = s.next.fetch_add(1, std::memory_order_relaxed);
      if (i >= s.count) break;
      const unsigned long long b = s.order.empty() ? i : s.order[i];
      const Dim3 idx{static_cast<unsigned>(b % g.x), static_cast<unsigned>(b / g.x % g.y),
                     static_cast<unsigned>(b / (static_cast<unsigned long long>(g.x) * g.y))};
      detail::run_block(*s.kernel, idx, resources);
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.error) s.error = std::current_exception();
    s.stop = true;
  }
}

}  // namespace

void launch(Dim3 grid, Dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body,
            const LaunchOptions& options) {
  if (on_fiber())
    throw SimtError("launch of kernel '" + options.name + "' from inside a kernel: dynamic parallelism is not emulated");
  if (!body) throw SimtError("launch of kernel '" + options.name + "': the body is empty");
  check_launch(options.name, grid, block, dynamic_shared_bytes);
  const detail::Kernel kernel{&body, grid, block, dynamic_shared_bytes, options.name, options.stack_bytes,
                              options.shared_poison};
  LaunchState s;
  s.kernel = &kernel;
  s.count = volume(grid);
  s.order = block_order(s.count, options.seed ? *options.seed : env_number("TRAINER_EMU_SEED", 0), options.name);
  const unsigned workers = static_cast<unsigned>(std::min<unsigned long long>(host_threads_of(options), s.count));
  s.exit_syncs.resize(workers);
  std::vector<std::thread> helpers;
  for (unsigned w = 1; w < workers; ++w) {
    try {
      helpers.emplace_back(run_worker, std::ref(s), w);
    } catch (const std::system_error&) {
      break;  // fewer host threads: the blocks are shared among those there are
    }
  }
  run_worker(s, 0);
  for (std::thread& t : helpers) t.join();
  // Everything the CUDA threads did happens before the launch returns.
  for (SyncObject& sync : s.exit_syncs) sanitizers::acquire(&sync);
  if (s.error) std::rethrow_exception(s.error);
}

}  // namespace trainer::emu
