// The formulas are transcribed from the PTX ISA section "Matrix Fragments for
// mma.m16n8k16 with floating point type" (the .f16/.bf16 A and B tables and
// the accumulator table), not derived from any kernel's use of them.
#include "emu/mma_fragments.h"

#include <stdexcept>
#include <string>

namespace trainer::emu {
namespace {

void check_index(const char* what, int lane, int i, int count) {
  if (lane < 0 || lane >= kPtxWarpLanes || i < 0 || i >= count)
    throw std::runtime_error(std::string("mma.m16n8k16 ") + what + " fragment: lane " + std::to_string(lane) +
                             " element " + std::to_string(i) + " is out of range (lanes 0-31, elements 0-" +
                             std::to_string(count - 1) + ")");
}

int group_id(int lane) { return lane >> 2; }
int thread_in_group(int lane) { return lane % 4; }

// Element i of a packed pair-of-16-bit registers: register i/2, low half for
// the even element ("Elements (low to high)").
uint16_t half_of(uint32_t reg, int i) { return uint16_t(i % 2 ? reg >> 16 : reg & 0xffffu); }
void set_half(uint32_t& reg, int i, uint16_t value) {
  reg = i % 2 ? (reg & 0x0000ffffu) | (uint32_t(value) << 16) : (reg & 0xffff0000u) | value;
}

}  // namespace

MatrixPosition mma_a_position(int lane, int i) {
  check_index("A", lane, i, 8);
  // row = groupID for 0 <= i < 2 || 4 <= i < 6, groupID + 8 otherwise;
  // col = threadID_in_group * 2 + (i & 1), plus 8 for i >= 4.
  const bool upper_rows = !(i < 2 || (i >= 4 && i < 6));
  return {group_id(lane) + (upper_rows ? 8 : 0), thread_in_group(lane) * 2 + (i & 1) + (i >= 4 ? 8 : 0)};
}

MatrixPosition mma_b_position(int lane, int i) {
  check_index("B", lane, i, 4);
  // row = threadID_in_group * 2 + (i & 1), plus 8 for i >= 2; col = groupID.
  return {thread_in_group(lane) * 2 + (i & 1) + (i >= 2 ? 8 : 0), group_id(lane)};
}

MatrixPosition mma_c_position(int lane, int i) {
  check_index("C/D", lane, i, 4);
  // row = groupID for i < 2, groupID + 8 for i >= 2;
  // col = threadID_in_group * 2 + (i & 1).
  return {group_id(lane) + (i >= 2 ? 8 : 0), thread_in_group(lane) * 2 + (i & 1)};
}

void pack_mma_a(const uint16_t A[kMmaM][kMmaK], uint32_t a[kPtxWarpLanes][4]) {
  for (int lane = 0; lane < kPtxWarpLanes; ++lane)
    for (int i = 0; i < 8; ++i) {
      if (i % 2 == 0) a[lane][i / 2] = 0;
      const MatrixPosition p = mma_a_position(lane, i);
      set_half(a[lane][i / 2], i, A[p.row][p.col]);
    }
}

void unpack_mma_a(const uint32_t a[kPtxWarpLanes][4], uint16_t A[kMmaM][kMmaK]) {
  for (int lane = 0; lane < kPtxWarpLanes; ++lane)
    for (int i = 0; i < 8; ++i) {
      const MatrixPosition p = mma_a_position(lane, i);
      A[p.row][p.col] = half_of(a[lane][i / 2], i);
    }
}

void pack_mma_b(const uint16_t B[kMmaK][kMmaN], uint32_t b[kPtxWarpLanes][2]) {
  for (int lane = 0; lane < kPtxWarpLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      if (i % 2 == 0) b[lane][i / 2] = 0;
      const MatrixPosition p = mma_b_position(lane, i);
      set_half(b[lane][i / 2], i, B[p.row][p.col]);
    }
}

void unpack_mma_b(const uint32_t b[kPtxWarpLanes][2], uint16_t B[kMmaK][kMmaN]) {
  for (int lane = 0; lane < kPtxWarpLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      const MatrixPosition p = mma_b_position(lane, i);
      B[p.row][p.col] = half_of(b[lane][i / 2], i);
    }
}

void pack_mma_c(const float C[kMmaM][kMmaN], float c[kPtxWarpLanes][4]) {
  for (int lane = 0; lane < kPtxWarpLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      const MatrixPosition p = mma_c_position(lane, i);
      c[lane][i] = C[p.row][p.col];
    }
}

void unpack_mma_c(const float c[kPtxWarpLanes][4], float C[kMmaM][kMmaN]) {
  for (int lane = 0; lane < kPtxWarpLanes; ++lane)
    for (int i = 0; i < 4; ++i) {
      const MatrixPosition p = mma_c_position(lane, i);
      C[p.row][p.col] = c[lane][i];
    }
}

}  // namespace trainer::emu
