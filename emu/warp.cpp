// The warp rendezvous behind every warp operation (emu/warp.h), and the
// checks of its mask.
#include <cstdio>
#include <cstring>

#include "emu/block.h"
#include "emu/sanitizers.h"
#include "emu/simt.h"

namespace trainer::emu {
namespace detail {
namespace {

std::string hex(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

unsigned lanes_in_warp(const Block& b, unsigned warp) {
  const size_t n = b.threads.size() - size_t{warp} * 32;
  return n < 32 ? static_cast<unsigned>(n) : 32;
}

void check_mask(const Block& b, const SimtThread& t, unsigned mask, const char* what) {
  const unsigned lane = t.linear % 32, warp = t.linear / 32;
  // Built only for an error: this runs at every warp operation of every lane.
  auto call = [&] { return std::string(what) + " with mask " + hex(mask); };
  if (!(mask >> lane & 1u)) fail(t, call() + " leaves out the calling lane " + std::to_string(lane));
  const unsigned lanes = lanes_in_warp(b, warp);
  if (lanes < 32 && (mask >> lanes) != 0)
    fail(t, call() + " names lane(s) " + lane_list(mask & ~((1u << lanes) - 1)) + " of warp " + std::to_string(warp) +
                ", which do not exist: the block has " + std::to_string(b.threads.size()) + " threads, so warp " +
                std::to_string(warp) + " has lanes 0-" + std::to_string(lanes - 1));
  unsigned gone = 0;
  for (unsigned l = 0; l < lanes; ++l)
    if ((mask >> l & 1u) && b.threads[warp * 32 + l].wait == Wait::kExited) gone |= 1u << l;
  if (gone) fail(t, call() + " names lane(s) " + lane_list(gone) + " of warp " + std::to_string(warp) + ", which exited");
}

// The open collective of this mask that the lane has not joined yet.
WarpGroup* find_group(Block& b, const SimtThread& t, unsigned mask, const CollectiveOp& op) {
  const unsigned lane = t.linear % 32;
  for (WarpGroup* g = b.open_groups[t.linear / 32]; g; g = g->next) {
    if (g->mask != mask || (g->arrived >> lane & 1u)) continue;
    if (g->op.run != op.run || std::strcmp(g->op.what, op.what) != 0)
      fail(t, std::string(op.what) + " with mask " + hex(mask) + ": lane(s) " + lane_list(g->arrived) +
                  " of this mask wait at " + g->op.what + " instead (or with other types)");
    return g;
  }
  return nullptr;
}

void unlink(Block& b, unsigned warp, WarpGroup* g) {
  for (WarpGroup** p = &b.open_groups[warp]; *p; p = &(*p)->next) {
    if (*p != g) continue;
    *p = g->next;
    return;
  }
}

// The last lane runs the collective for all and wakes the others.
void complete(Block& b, const SimtThread& t, WarpGroup& g, const CollectiveOp& op) {
  const unsigned warp = t.linear / 32;
  unlink(b, warp, &g);
  sanitizers::acquire(&g);
  {
    sanitizers::SeeAccesses seen;  // what the collective reads and writes is the kernel's
    op.run(op.fn, g.ins, g.outs, g.mask);
  }
  for (unsigned lane = 0; lane < 32; ++lane) {
    SimtThread& u = b.threads[warp * 32 + lane];
    if ((g.mask >> lane & 1u) && &u != &t) wake(b, u);
  }
}

}  // namespace

std::string lane_list(unsigned lanes) {
  std::string text;
  for (unsigned l = 0; l < 32; ++l) {
    if (!(lanes >> l & 1u)) continue;
    unsigned end = l;
    while (end + 1 < 32 && (lanes >> (end + 1) & 1u)) ++end;
    if (!text.empty()) text += ", ";
    text += std::to_string(l);
    if (end > l) text += '-' + std::to_string(end);
    l = end;
  }
  return text;
}

void warp_rendezvous(unsigned mask, const void* in, void* out, const CollectiveOp& op) {
  SimtThread& t = current_thread(op.what);
  sanitizers::IgnoreAccesses ignore;
  throw_if_cancelled(t);
  Block& b = *t.block;
  check_mask(b, t, mask, op.what);
  const unsigned lane = t.linear % 32, warp = t.linear / 32;
  WarpGroup opened;
  WarpGroup* g = find_group(b, t, mask, op);
  if (!g) {
    g = &opened;
    g->mask = mask;
    g->op = op;
    g->next = b.open_groups[warp];
    b.open_groups[warp] = g;
  }
  g->ins[lane] = in;
  g->outs[lane] = out;
  g->arrived |= 1u << lane;
  sanitizers::release(g);
  if (g->arrived == mask) {
    complete(b, t, *g, op);
    return;
  }
  t.wait = Wait::kWarp;
  t.group = g;
  wait_until_woken(t);
}

// A lane that exits while an open collective names it would leave the lanes
// there waiting for ever: an error, on the exiting thread.
void warp_thread_exited(Block& b, SimtThread& t) {
  const unsigned lane = t.linear % 32;
  for (WarpGroup* g = b.open_groups[t.linear / 32]; g; g = g->next) {
    if (!(g->mask >> lane & 1u)) continue;
    if (!t.error)
      t.error = std::make_exception_ptr(SimtError(
          where(t) + ": exited while lane(s) " + lane_list(g->arrived) + " wait for it at " + g->op.what +
          " with mask " + hex(g->mask)));
    return;
  }
}

unsigned shfl_source(ShflMode mode, unsigned lane, unsigned b, unsigned width) {
  const unsigned segmask = (32 - width) & 31;   // PTX's c[12:8]: the lane bits that pick the segment
  const unsigned first = lane & segmask;        // the segment's first lane
  const unsigned last = first | (31 & ~segmask);
  b &= 31;
  switch (mode) {
    case ShflMode::kIdx: return first | (b & ~segmask & 31);
    case ShflMode::kUp: return lane >= first + b ? lane - b : lane;
    case ShflMode::kDown: return lane + b <= last ? lane + b : lane;
    case ShflMode::kXor: return (lane ^ b) <= last ? lane ^ b : lane;
  }
  return lane;
}

}  // namespace detail

void sync_warp(unsigned mask) {
  warp_collective<char>(mask, char{}, [](const char*, char*, unsigned) {}, "sync_warp");
}

unsigned ballot(unsigned mask, bool pred) {
  return warp_collective<unsigned>(
      mask, pred,
      [](const bool* preds, unsigned* outs, unsigned m) {
        unsigned bits = 0;
        for (unsigned lane = 0; lane < 32; ++lane)
          if ((m >> lane & 1u) && preds[lane]) bits |= 1u << lane;
        for (unsigned lane = 0; lane < 32; ++lane) outs[lane] = bits;
      },
      "ballot_sync");
}

}  // namespace trainer::emu
