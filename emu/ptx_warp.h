// The warp the warp-wide PTX instructions (mma.sync, ldmatrix.sync) act on:
// their emulations take every lane's registers at once, indexed by %laneid.
#pragma once

namespace trainer::emu {

inline constexpr int kPtxWarpLanes = 32;

}  // namespace trainer::emu
