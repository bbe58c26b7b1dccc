// Where each matrix element of mma.m16n8k16 (16-bit floating point A and B,
// .f32 C and D) lives in the warp's registers: PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type". With
//   groupID = %laneid >> 2, threadID_in_group = %laneid % 4,
// lane l's elements a0..a7, b0..b3 and c0..c3 sit at the (row, col) the
// position functions below return, and the 16-bit elements are packed two per
// .b32 register "low to high": a0 in the low half of register 0, a1 in its
// high half, a2/a3 in register 1, and so on (likewise b0..b3 in two
// registers). The pack/unpack helpers move whole matrices between the plain
// row-major form and the per-lane registers, for tests and for a host that
// stages operands.
#pragma once

#include <cstdint>

#include "emu/ptx_warp.h"

namespace trainer::emu {

inline constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;

struct MatrixPosition {
  int row = 0, col = 0;
};

// A is M x K (.row), element index i in 0..7.
MatrixPosition mma_a_position(int lane, int i);
// B is K x N (.col: its fragments run down a column), element index i in 0..3.
MatrixPosition mma_b_position(int lane, int i);
// C and D are M x N, element index i in 0..3.
MatrixPosition mma_c_position(int lane, int i);

// Matrices of raw 16-bit elements (bf16 or f16 bits, the layout does not care).
void pack_mma_a(const uint16_t A[kMmaM][kMmaK], uint32_t a[kPtxWarpLanes][4]);
void unpack_mma_a(const uint32_t a[kPtxWarpLanes][4], uint16_t A[kMmaM][kMmaK]);
void pack_mma_b(const uint16_t B[kMmaK][kMmaN], uint32_t b[kPtxWarpLanes][2]);
void unpack_mma_b(const uint32_t b[kPtxWarpLanes][2], uint16_t B[kMmaK][kMmaN]);
void pack_mma_c(const float C[kMmaM][kMmaN], float c[kPtxWarpLanes][4]);
void unpack_mma_c(const float c[kPtxWarpLanes][4], float C[kMmaM][kMmaN]);

}  // namespace trainer::emu
