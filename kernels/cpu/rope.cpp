// Rotary position embedding of the CPU backend (see kernels/op_list.h),
// half-split convention: pair (x[i], x[i + D/2]) at position p = pos_offset + t
// (rope_forward) or p = pos[t] (rope_forward_pos) turns by p * inv_freq[i]
// (kernels/rope_freqs.h: theta^(-2i/D), or its scaling).
// Both build their table through the same code from the same position, so a
// position gets the same bits whichever op names it.
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

constexpr int64_t kParallelMin = 1 << 15;

// sign = +1 rotates forward, -1 applies the inverse (transposed) rotation.
// Row t is at position pos_offset + t, or pos[t] when pos is not null, or
// pos[b, t] when pos holds one position per token ([B, T]).
void rotate(const char* op, const char* out_name, Tensor out, const char* inp_name, Tensor inp,
            const Rope& rope, int64_t pos_offset, const Tensor* pos, float sign) {
  need_f32(op, {{out_name, &out}, {inp_name, &inp}});
  const int32_t* positions = pos != nullptr ? pos->i32() : nullptr;
  const int64_t B = inp.dim(0), T = inp.dim(1), H = inp.dim(2), D = inp.dim(3), half = D / 2;
  const bool per_token = pos != nullptr && pos->numel() == B * T && pos->ndim == 2;
  const int64_t R = per_token ? B * T : T;  // rows of the table
  // Angles in double, rounded once to float cos/sin: at t in the thousands a
  // float angle alone would be off by ~1e-4 rad.
  // The table is R x D/2 double sin/cos, as much work as rotating a few heads.
  const std::vector<double> inv_freq = ops::rope_inv_freqs(D, rope);
  std::vector<float> cs(size_t(R * half)), sn(size_t(R * half));
#pragma omp parallel for if (R * half >= (1 << 13))
  for (int64_t t = 0; t < R; ++t)
    for (int64_t i = 0; i < half; ++i) {
      // The angle depends on the absolute position only, so a chunk starting
      // at pos_offset gets the same bits as those positions of the whole.
      const int64_t p = pos != nullptr ? int64_t(positions[t]) : pos_offset + t;
      const double a = double(p) * inv_freq[size_t(i)];
      cs[size_t(t * half + i)] = float(std::cos(a));
      sn[size_t(t * half + i)] = sign * float(std::sin(a));
    }
  const float* x = inp.f32();
  float* y = out.f32();
#pragma omp parallel for collapse(2) if (inp.numel() >= kParallelMin)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const float* c = cs.data() + (per_token ? b * T + t : t) * half;
      const float* s = sn.data() + (per_token ? b * T + t : t) * half;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t off = ((b * T + t) * H + h) * D;
        // Both halves are read before either is written, so out may alias inp.
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = x[off + i], x1 = x[off + i + half];
          y[off + i] = x0 * c[i] - x1 * s[i];
          y[off + i + half] = x0 * s[i] + x1 * c[i];
        }
      }
    }
}

}  // namespace

void rope_forward(Tensor out, Tensor inp, const Rope& rope, int64_t pos_offset) {
  rotate("rope_forward", "out", out, "inp", inp, rope, pos_offset, nullptr, 1.f);
}

// The rotation is orthogonal, so its gradient is the rotation by -angle.
void rope_backward(Tensor dinp, Tensor dout, const Rope& rope, int64_t pos_offset) {
  rotate("rope_backward", "dinp", dinp, "dout", dout, rope, pos_offset, nullptr, -1.f);
}

void rope_forward_pos(Tensor out, Tensor inp, const Rope& rope, Tensor pos) {
  rotate("rope_forward_pos", "out", out, "inp", inp, rope, 0, &pos, 1.f);
}

void rope_backward_pos(Tensor dinp, Tensor dout, const Rope& rope, Tensor pos) {
  rotate("rope_backward_pos", "dinp", dinp, "dout", dout, rope, 0, &pos, -1.f);
}

}  // namespace trainer::cpu
