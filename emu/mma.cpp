#include "emu/mma.h"

#include "emu/mma_fragments.h"

namespace trainer::emu {

void mma_m16n8k16(Type16 type, const uint32_t a[kPtxWarpLanes][4], const uint32_t b[kPtxWarpLanes][2],
                  const float c[kPtxWarpLanes][4], float d[kPtxWarpLanes][4]) {
  // Gather the warp's fragments into whole matrices first: that is what the
  // instruction means, and it leaves d free to alias c.
  uint16_t A[kMmaM][kMmaK], B[kMmaK][kMmaN];
  float C[kMmaM][kMmaN], D[kMmaM][kMmaN];
  unpack_mma_a(a, A);
  unpack_mma_b(b, B);
  unpack_mma_c(c, C);
  double Bf[kMmaK][kMmaN];
  for (int k = 0; k < kMmaK; ++k)
    for (int j = 0; j < kMmaN; ++j) Bf[k][j] = to_float(type, B[k][j]);
  for (int i = 0; i < kMmaM; ++i) {
    double Ai[kMmaK];
    for (int k = 0; k < kMmaK; ++k) Ai[k] = to_float(type, A[i][k]);
    for (int j = 0; j < kMmaN; ++j) {
      double sum = C[i][j];
      for (int k = 0; k < kMmaK; ++k) sum += Ai[k] * Bf[k][j];
      D[i][j] = float(sum);  // the one rounding
    }
  }
  pack_mma_c(D, d);
}

}  // namespace trainer::emu
