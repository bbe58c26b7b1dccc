// mma.sync.aligned.m16n8k16.row.col.f32.{bf16.bf16,f16.f16}.f32 d, a, b, c:
// D = A * B + C for A 16x16, B 16x8, C and D 16x8 .f32, computed for the
// whole warp at once from every lane's registers (the fragment layout is
// emu/mma_fragments.h's, the PTX ISA's).
#pragma once

#include <cstdint>

#include "emu/bf16_bits.h"
#include "emu/ptx_warp.h"

namespace trainer::emu {

// a[lane] is the lane's {a0a1, a2a3, a4a5, a6a7} .b32 registers, b[lane] its
// {b0b1, b2b3}, c[lane] and d[lane] its c0..c3 / d0..d3. `type` is the
// instruction's .atype/.btype. d may be the same array as c (kernels pass
// the accumulators as both operands).
//
// Numerics: every product of two 16-bit floats is exact (in float, and in
// the double used here); each D(i,j) is C(i,j) plus the 16 products in k
// order, summed in double and rounded once to float (round to nearest even).
// Real tensor cores differ: the ISA leaves "the accumulation order, rounding
// and handling of subnormal inputs" unspecified and promises only "at least
// single precision" accumulation; the emulator does not model any particular
// chip, so results can differ from hardware in the last bits. Subnormal
// inputs are kept (not flushed); NaN and Inf propagate as IEEE arithmetic
// makes them (Inf * 0 and Inf - Inf give NaN).
void mma_m16n8k16(Type16 type, const uint32_t a[kPtxWarpLanes][4], const uint32_t b[kPtxWarpLanes][2],
                  const float c[kPtxWarpLanes][4], float d[kPtxWarpLanes][4]);

}  // namespace trainer::emu
