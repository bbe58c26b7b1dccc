// The message of a deadlock: every live thread of the block waits, and for
// what, in runs of consecutive threads that wait for the same thing.
#include <cstdio>

#include "emu/block.h"

namespace trainer::emu::detail {
namespace {

std::string waits_for(const SimtThread& t) {
  if (t.wait == Wait::kBarrier) return "wait at __syncthreads";
  if (t.wait != Wait::kWarp || !t.group) return "are ready";  // cannot happen with an empty ready queue
  char mask[16];
  std::snprintf(mask, sizeof mask, "0x%08x", t.group->mask);
  return "wait at " + std::string(t.group->op.what) + " with mask " + mask + " in warp " +
         std::to_string(t.linear / 32) + " for lane(s) " + lane_list(t.group->mask & ~t.group->arrived);
}

std::string run_text(const Block& b, size_t first, size_t last) {
  const SimtThread& a = b.threads[first];
  const SimtThread& z = b.threads[last];
  if (first == last) return "  thread " + std::to_string(first) + " " + dim_text(a.idx);
  return "  threads " + std::to_string(first) + "-" + std::to_string(last) + " " + dim_text(a.idx) + "-" +
         dim_text(z.idx);
}

}  // namespace

std::string describe_deadlock(const Block& b) {
  std::string text = "kernel '" + b.kernel->name + "' block " + dim_text(b.idx) +
                     ": deadlock, every live thread waits for another (" + std::to_string(b.arrived) + " of " +
                     std::to_string(b.threads.size()) + " threads at __syncthreads, " + std::to_string(b.exited) +
                     " exited):";
  size_t first = 0;
  std::string run;
  for (size_t i = 0; i <= b.threads.size(); ++i) {
    const bool live = i < b.threads.size() && b.threads[i].wait != Wait::kExited;
    const std::string what = live ? waits_for(b.threads[i]) : "";
    if (i > first && what == run && live) continue;
    if (!run.empty()) {
      text += '\n';
      text += run_text(b, first, i - 1) + " " + run;
    }
    first = i;
    run = what;
  }
  return text;
}

}  // namespace trainer::emu::detail
