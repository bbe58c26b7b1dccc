// Warp rendezvous: the lanes named in a mask wait for one another, and the
// last to arrive computes every lane's result at once. __syncwarp, the
// ballot, the shuffles (emu/shuffle.h) and later the PTX warp instructions
// (mma.sync, ldmatrix) are all this one operation with different functions.
//
// Lanes are consecutive linear thread ids (x fastest, then y, z) in groups of
// 32; a block's last warp may be partial. The mask must name the calling
// lane and only lanes that exist and have not exited: anything else is an
// error naming the lanes. Lanes naming the same mask wait for one another;
// lanes of one mask calling different operations are an error too.
#pragma once

#include <string>
#include <type_traits>

namespace trainer::emu {

namespace detail {

// A collective with its types erased: `run` calls the typed function `fn`
// with the lanes' inputs gathered and scatters its outputs back.
struct CollectiveOp {
  const char* what;
  void (*run)(void* fn, const void* const* ins, void* const* outs, unsigned mask);
  void* fn;
};

// Deposits `in`, waits for the mask's other lanes, and returns with `out`
// written by whichever lane completed the collective.
void warp_rendezvous(unsigned mask, const void* in, void* out, const CollectiveOp& op);

// Throws a SimtError naming the kernel, block and thread.
[[noreturn]] void fail_in_kernel(const std::string& message);

}  // namespace detail

// Each lane of `mask` deposits `in`; when all have arrived,
// fn(const In* ins /*[32], by lane*/, Out* outs /*[32]*/, unsigned mask)
// runs once (on the last lane to arrive) and each lane gets its outs[lane].
// Entries of lanes outside the mask are value-initialized and ignored. The
// collective orders memory like __syncwarp among its lanes. The lanes must
// call it with the same In, Out and Fn types; `what` names it in errors.
template <class Out, class In, class Fn>
Out warp_collective(unsigned mask, const In& in, Fn&& fn, const char* what = "warp_collective") {
  static_assert(std::is_default_constructible_v<In> && std::is_default_constructible_v<Out>,
                "warp_collective: In and Out must be default-constructible (value arrays of 32 lanes)");
  using F = std::remove_reference_t<Fn>;
  Out out{};
  auto run = [](void* f, const void* const* ins, void* const* outs, unsigned m) {
    In in_values[32]{};
    Out out_values[32]{};
    for (unsigned lane = 0; lane < 32; ++lane)
      if (m >> lane & 1u) in_values[lane] = *static_cast<const In*>(ins[lane]);
    (*static_cast<F*>(f))(static_cast<const In*>(in_values), static_cast<Out*>(out_values), m);
    for (unsigned lane = 0; lane < 32; ++lane)
      if (m >> lane & 1u) *static_cast<Out*>(outs[lane]) = out_values[lane];
  };
  detail::warp_rendezvous(mask, &in, &out, detail::CollectiveOp{what, run, const_cast<void*>(static_cast<const void*>(&fn))});
  return out;
}

// __syncwarp(mask): the lanes wait for one another; memory written before by
// one is visible after to the others.
void sync_warp(unsigned mask = 0xffffffffu);

// __ballot_sync: bit `lane` set for each lane of `mask` whose pred is true.
unsigned ballot(unsigned mask, bool pred);

}  // namespace trainer::emu
