// The warp shuffles (__shfl_sync, __shfl_up_sync, __shfl_down_sync,
// __shfl_xor_sync) with the CUDA Programming Guide's semantics, which are
// PTX shfl.sync's: `width` (a power of two up to 32) splits the warp into
// segments of that many lanes. idx reads lane src_lane % width of the
// caller's segment; up and down read `delta` lanes away and return the
// caller's own value when that leaves the segment; xor reads lane ^ lane_mask
// and returns the caller's own value when that lies in a later segment (an
// earlier one is read). A source lane that is not in the mask gives an
// undefined value: here, all bits set.
#pragma once

#include <cstring>
#include <string>
#include <type_traits>

#include "emu/warp.h"

namespace trainer::emu {

namespace detail {

enum class ShflMode { kIdx, kUp, kDown, kXor };

// The lane `lane` reads from (itself when the source lies out of bounds), as
// PTX computes it from the operand b and the segment width.
unsigned shfl_source(ShflMode mode, unsigned lane, unsigned b, unsigned width);

template <class T>
struct ShflIn {
  T value{};
  unsigned b = 0;
  unsigned width = 32;
};

template <class T>
T shuffle(ShflMode mode, const char* what, unsigned mask, T var, unsigned b, int width) {
  static_assert(std::is_trivially_copyable_v<T> && (sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8),
                "shuffles move trivially copyable values of 2, 4 or 8 bytes");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail_in_kernel(std::string(what) + ": width " + std::to_string(width) + " is not a power of two from 1 to 32");
  auto fn = [mode](const ShflIn<T>* ins, T* outs, unsigned m) {
    for (unsigned lane = 0; lane < 32; ++lane) {
      if (!(m >> lane & 1u)) continue;
      const unsigned src = shfl_source(mode, lane, ins[lane].b, ins[lane].width);
      if (m >> src & 1u) {
        outs[lane] = ins[src].value;
      } else {
        std::memset(static_cast<void*>(&outs[lane]), 0xFF, sizeof(T));
      }
    }
  };
  return warp_collective<T>(mask, ShflIn<T>{var, b, static_cast<unsigned>(width)}, fn, what);
}

}  // namespace detail

template <class T>
T shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return detail::shuffle(detail::ShflMode::kIdx, "shfl_sync", mask, var, static_cast<unsigned>(src_lane), width);
}

template <class T>
T shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return detail::shuffle(detail::ShflMode::kUp, "shfl_up_sync", mask, var, delta, width);
}

template <class T>
T shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return detail::shuffle(detail::ShflMode::kDown, "shfl_down_sync", mask, var, delta, width);
}

template <class T>
T shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return detail::shuffle(detail::ShflMode::kXor, "shfl_xor_sync", mask, var, static_cast<unsigned>(lane_mask), width);
}

}  // namespace trainer::emu
