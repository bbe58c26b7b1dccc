// ldmatrix and mma.sync for one lane: every lane deposits its operands in a
// warp collective, and the last to arrive computes the whole warp's result
// with the ISA-level emulation, which hands each lane its own registers.
#include "emu/ptx_lane.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "emu/ldmatrix.h"
#include "emu/mma.h"
#include "emu/warp.h"

namespace trainer::emu {
namespace {

// .aligned .sync instructions: all 32 lanes execute them together.
constexpr unsigned kFullWarp = 0xffffffffu;

struct Fragment4 {
  uint32_t r[4] = {};
};

struct MmaIn {
  uint32_t a[4] = {};
  uint32_t b[2] = {};
  float c[4] = {};
};

struct MmaOut {
  float d[4] = {};
};

void ldmatrix_warp(bool trans, const void* const* rows, Fragment4* out) {
  const void* lane_addr[kPtxWarpLanes];
  uint32_t regs[kPtxWarpLanes][4] = {};
  for (int lane = 0; lane < kPtxWarpLanes; ++lane) lane_addr[lane] = rows[lane];
  try {
    ldmatrix(4, trans, lane_addr, regs);
  } catch (const std::runtime_error& e) {
    detail::fail_in_kernel(e.what());
  }
  for (int lane = 0; lane < kPtxWarpLanes; ++lane) std::memcpy(out[lane].r, regs[lane], sizeof regs[lane]);
}

void mma_warp(Type16 type, const MmaIn* in, MmaOut* out) {
  uint32_t a[kPtxWarpLanes][4], b[kPtxWarpLanes][2];
  float c[kPtxWarpLanes][4], d[kPtxWarpLanes][4];
  for (int lane = 0; lane < kPtxWarpLanes; ++lane) {
    std::memcpy(a[lane], in[lane].a, sizeof a[lane]);
    std::memcpy(b[lane], in[lane].b, sizeof b[lane]);
    std::memcpy(c[lane], in[lane].c, sizeof c[lane]);
  }
  mma_m16n8k16(type, a, b, c, d);
  for (int lane = 0; lane < kPtxWarpLanes; ++lane) std::memcpy(out[lane].d, d[lane], sizeof d[lane]);
}

}  // namespace

void ldmatrix_x4_lane(uint32_t (&r)[4], const void* row, bool trans) {
  const char* what = trans ? "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" : "ldmatrix.sync.aligned.m8n8.x4.shared.b16";
  auto fn = [trans](const void* const* rows, Fragment4* out, unsigned) { ldmatrix_warp(trans, rows, out); };
  const Fragment4 mine = warp_collective<Fragment4>(kFullWarp, row, fn, what);
  std::memcpy(r, mine.r, sizeof mine.r);
}

void mma_m16n8k16_lane(Type16 type, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  MmaIn in;
  std::memcpy(in.a, a, sizeof in.a);
  in.b[0] = b0;
  in.b[1] = b1;
  std::memcpy(in.c, c, sizeof in.c);
  auto fn = [type](const MmaIn* ins, MmaOut* outs, unsigned) { mma_warp(type, ins, outs); };
  const char* what = type == Type16::bf16 ? "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
                                          : "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32";
  const MmaOut out = warp_collective<MmaOut>(kFullWarp, in, fn, what);
  std::memcpy(c, out.d, sizeof out.d);
}

}  // namespace trainer::emu
