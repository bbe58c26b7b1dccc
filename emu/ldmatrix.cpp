#include "emu/ldmatrix.h"

#include <cstring>
#include <sstream>
#include <stdexcept>

namespace trainer::emu {
namespace {

constexpr int kRows = 8;             // an m8n8 matrix
constexpr uintptr_t kRowBytes = 16;  // 8 b16 elements

std::string form_name(int count, bool trans) {
  return "ldmatrix.sync.aligned.m8n8.x" + std::to_string(count) + (trans ? ".trans" : "") + ".shared.b16";
}

std::string lane_name(int lane) {
  return "lane " + std::to_string(lane) + " (row " + std::to_string(lane % kRows) + " of matrix " +
         std::to_string(lane / kRows) + ")";
}

// Only the lanes the form reads are checked: an .x1/.x2 kernel may leave
// garbage in the higher lanes.
void check_addresses(int count, bool trans, const void* const lane_addr[kPtxWarpLanes]) {
  for (int lane = 0; lane < kRows * count; ++lane) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(lane_addr[lane]);
    if (addr == 0)
      throw std::runtime_error(form_name(count, trans) + ": " + lane_name(lane) + " passes a null row address");
    if (addr % kRowBytes == 0) continue;
    std::ostringstream message;
    message << form_name(count, trans) << ": " << lane_name(lane) << " passes row address 0x" << std::hex << addr
            << std::dec << ", " << addr % kRowBytes
            << " bytes past a 16-byte boundary: a row is 8 b16 elements (16 bytes) and must be 16-byte aligned";
    throw std::runtime_error(message.str());
  }
}

// Element (row, col) of matrix m as stored: col-th b16 of row-th address.
uint16_t stored_element(const void* const lane_addr[kPtxWarpLanes], int m, int row, int col) {
  uint16_t value;
  std::memcpy(&value, static_cast<const unsigned char*>(lane_addr[m * kRows + row]) + 2 * col, sizeof(value));
  return value;
}

}  // namespace

void ldmatrix(int count, bool trans, const void* const lane_addr[kPtxWarpLanes], uint32_t out[kPtxWarpLanes][4]) {
  if (count != 1 && count != 2 && count != 4)
    throw std::runtime_error("ldmatrix: .num must be .x1, .x2 or .x4 (count 1, 2 or 4), not " + std::to_string(count));
  check_addresses(count, trans, lane_addr);
  for (int lane = 0; lane < kPtxWarpLanes; ++lane) {
    const int fragment_row = lane / 4, first_col = 2 * (lane % 4);
    for (int m = 0; m < count; ++m) {
      // The fragment's (row, col) is the stored matrix's (col, row) under .trans.
      const uint16_t lo = trans ? stored_element(lane_addr, m, first_col, fragment_row)
                                : stored_element(lane_addr, m, fragment_row, first_col);
      const uint16_t hi = trans ? stored_element(lane_addr, m, first_col + 1, fragment_row)
                                : stored_element(lane_addr, m, fragment_row, first_col + 1);
      out[lane][m] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

}  // namespace trainer::emu
