// The hand-written PTX of the kernels (kernels/cuda/ptx.cuh) as one CUDA
// thread issues it: each function is called by every lane with its own
// operands, as the instruction is, and reaches the whole-warp emulations
// (emu/ldmatrix.h, emu/mma.h, emu/cp_async.h) through a warp collective or
// the thread's own cp.async queue. Errors (a misaligned row address, a lane
// missing from a .sync instruction) stop the kernel naming the thread.
#pragma once

#include <cstdint>

#include "emu/bf16_bits.h"
#include "emu/cp_async.h"

namespace trainer::emu {

// The calling CUDA thread's cp.async queue, made on its first copy. When the
// thread exits, copies it never waited for still land (hardware carries them
// out) and the first such thread of the process is reported on stderr: a
// kernel reading them would race.
CpAsyncQueue& thread_cp_async_queue();

// ldmatrix.sync.aligned.m8n8.x4{,.trans}.shared.b16: `row` is this lane's
// row address (lanes 8i..8i+7 give matrix i's rows); r[i] receives this
// lane's fragment of matrix i. Every lane of the warp must call it.
void ldmatrix_x4_lane(uint32_t (&r)[4], const void* row, bool trans);

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.f32 with D = C = c: this
// lane's A, B and C registers in, its D registers out. Every lane of the
// warp must call it.
void mma_m16n8k16_lane(Type16 type, float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

}  // namespace trainer::emu
