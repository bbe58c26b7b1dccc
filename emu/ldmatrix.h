// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16: the warp loads
// one, two or four 8x8 matrices of 16-bit elements from shared memory into
// the mma fragment layout (PTX ISA, "Warp-level matrix load instruction:
// ldmatrix"). Per the ISA:
// - threads 0-7 give the row addresses (addr0-addr7) of matrix 0, threads
//   8-15 those of matrix 1, 16-23 matrix 2, 24-31 matrix 3; .x1 uses only
//   threads 0-7, .x2 threads 0-15 (the other lanes' addresses are not read);
//   rows need not be contiguous, each is 8 elements = 16 bytes, "naturally
//   aligned" (16 bytes);
// - lane l receives, in destination register m, its fragment of matrix m:
//   row l/4, elements 2*(l%4) (low 16 bits) and 2*(l%4)+1 (high 16 bits),
//   "a group of four threads loads an entire row" (Figure "ldmatrix fragment
//   layout for one 8x8 Matrix with 16-bit elements");
// - .trans loads the matrix "in column-major format": lane l receives
//   elements (2*(l%4), l/4) and (2*(l%4)+1, l/4) of the matrix as stored.
#pragma once

#include <cstdint>

#include "emu/ptx_warp.h"

namespace trainer::emu {

// count: 1, 2 or 4 (.x1/.x2/.x4). lane_addr[l]: the address lane l passes (a
// host pointer standing for the shared-memory address). Writes out[l][0] ..
// out[l][count-1] for every lane and leaves the other registers alone.
// Throws std::runtime_error on a bad count or a null or misaligned row
// address of a lane the form reads.
void ldmatrix(int count, bool trans, const void* const lane_addr[kPtxWarpLanes], uint32_t out[kPtxWarpLanes][4]);

}  // namespace trainer::emu
