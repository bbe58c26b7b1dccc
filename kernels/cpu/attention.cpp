// Scaled dot-product attention of the CPU backend (see kernels/op_list.h), with
// grouped-query heads, an optional causal mask and an optional sliding window.
//
// Work is split into (batch, head) pairs, one OpenMP thread each; within a
// pair, blocks of kBlock query rows go through sgemm against the keys they can
// see, so a causal pass does about half the multiply work of the full square,
// a window of W keys about T (W + kBlock) of it, and the score scratch stays
// kBlock x T per thread however long T is. A block's keys are the union of
// its rows' spans, exactly what attention_positions.cpp computes for
// identity positions, so the two give the same bits.
// Backward recomputes the probabilities from the saved log-sum-exp, as flash
// attention does, instead of keeping a [B, H, T, T] tensor alive.
// Separate documents (doc_start) narrow each row's keys to its document the
// way the window does: a block of rows starts at its first row's bound, so
// keys of earlier documents cost nothing.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/attention_math.h"
#include "kernels/cpu/attention_threads.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

using namespace attention_math;
using namespace attention_threads;

struct Dims {
  int64_t B, T, Hq, Hkv, D;
};

// Shapes are checked by the router (kernels/checks/attention.cpp).
Dims dims(const char* op, const Tensor& q, const Tensor& k) {
  const Dims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  if (d.T > INT_MAX / 2 || d.Hq * d.D > INT_MAX)
    checks::fail(op, "q " + q.shape_str() + " is too large for a 32-bit BLAS");
  return d;
}

// Row i sees keys [first_key(i), end_key(i)): a window W > 0 (causal only,
// checked by the router) drops keys more than W positions back, and with
// separate documents (ds: the sequence's doc_start row, else null) keys
// before the row's document start. Both bounds only grow with i, so a block's
// first row has the block's smallest first key. Clamped to i: a row always
// sees itself, whatever doc_start says.
inline int64_t first_key(int64_t i, int64_t window, const int32_t* ds) {
  const int64_t w = window > 0 ? std::max<int64_t>(0, i - window) : 0;
  return ds ? std::min<int64_t>(std::max<int64_t>(w, ds[i]), i) : w;
}
inline int64_t end_key(int64_t i, int64_t T, bool causal) { return causal ? i + 1 : T; }

// Keys a row sees at most, for the thread-count estimate.
inline int64_t keys_per_row(int64_t T, int64_t window) { return window > 0 ? std::min(T, window + 1) : T; }

}  // namespace

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, bool causal, int64_t window,
                       Tensor doc_start) {
  const char* op = "attention_forward";
  need_f32(op, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}});
  const auto [B, T, Hq, Hkv, D] = dims(op, q, k);
  if (B == 0 || T == 0 || Hq == 0) return;
  const int64_t group = Hq / Hkv, ldq = Hq * D, ldk = Hkv * D;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *op_ = out.f32(), *lp = lse.f32();
  const int32_t* dsp = doc_start.empty() ? nullptr : doc_start.i32();

  const int64_t pairs = B * Hq;
  for_each_pair(pairs, pairs * T * keys_per_row(T, window) * D, kBlock * T, [&](int64_t p, float* s) {
    const int64_t b = p / Hq, h = p % Hq, g = h / group;
    const float* Q = qp + b * T * ldq + h * D;
    const float* K = kp + b * T * ldk + g * D;
    const float* V = vp + b * T * ldk + g * D;
    float* O = op_ + b * T * ldq + h * D;
    float* L = lp + (b * Hq + h) * T;
    const int32_t* ds = dsp ? dsp + b * T : nullptr;
    for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
      const int64_t rows = std::min(kBlock, T - i0);
      const int64_t klo = first_key(i0, window, ds), keys = end_key(i0 + rows - 1, T, causal) - klo;
      block_scores(rows, keys, D, scale, Q + i0 * ldq, ldq, K + klo * ldk, ldk, s);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t a = first_key(i0 + r, window, ds) - klo, n = end_key(i0 + r, T, causal) - klo - a;
        L[i0 + r] = softmax_row(s + r * keys, keys, a, n);
      }
      block_times_keys(rows, D, keys, 1.f, s, V + klo * ldk, ldk, 0.f, O + i0 * ldq, ldq);
    }
  });
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v,
                        Tensor out, Tensor lse, bool causal, int64_t window, Tensor doc_start) {
  const char* op = "attention_backward";
  need_f32(op, {{"dq", &dq},
                {"dk", &dk},
                {"dv", &dv},
                {"dout", &dout},
                {"q", &q},
                {"k", &k},
                {"v", &v},
                {"out", &out}});
  const auto [B, T, Hq, Hkv, D] = dims(op, q, k);
  if (B == 0 || T == 0 || Hq == 0) return;
  const int64_t group = Hq / Hkv, ldq = Hq * D, ldk = Hkv * D;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32(), *gp = dout.f32(), *outp = out.f32(),
              *lp = lse.f32();
  float *dqp = dq.f32(), *dkp = dk.f32(), *dvp = dv.f32();
  const int32_t* dsp = doc_start.empty() ? nullptr : doc_start.i32();

  // One thread owns a kv head and every query head that reads it, so dk and dv
  // are summed over the group without atomics and in a fixed order.
  const int64_t pairs = B * Hkv;
  const int64_t macs = B * Hq * T * keys_per_row(T, window) * D;
  for_each_pair(pairs, macs, 2 * kBlock * T + kBlock, [&](int64_t p, float* P) {
    const int64_t b = p / Hkv, g = p % Hkv;
    const float* K = kp + b * T * ldk + g * D;
    const float* V = vp + b * T * ldk + g * D;
    float* dK = dkp + b * T * ldk + g * D;
    float* dV = dvp + b * T * ldk + g * D;
    for (int64_t t = 0; t < T; ++t) {
      std::memset(dK + t * ldk, 0, size_t(D) * sizeof(float));
      std::memset(dV + t * ldk, 0, size_t(D) * sizeof(float));
    }
    float* dS = P + kBlock * T;
    float* delta = dS + kBlock * T;
    const int32_t* ds = dsp ? dsp + b * T : nullptr;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const int64_t base = b * T * ldq + h * D;
      const float* L = lp + (b * Hq + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
        const int64_t rows = std::min(kBlock, T - i0);
        const int64_t klo = first_key(i0, window, ds), keys = end_key(i0 + rows - 1, T, causal) - klo;
        const float* Q = qp + base + i0 * ldq;
        const float* dO = gp + base + i0 * ldq;
        row_deltas(delta, rows, dO, outp + base + i0 * ldq, ldq, D);
        const float* Kb = K + klo * ldk;
        block_scores(rows, keys, D, scale, Q, ldq, Kb, ldk, P);
        block_scores(rows, keys, D, 1.f, dO, ldq, V + klo * ldk, ldk, dS);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t a = first_key(i0 + r, window, ds) - klo, n = end_key(i0 + r, T, causal) - klo - a;
          softmax_grad_block_row(P + r * keys, dS + r * keys, keys, a, n, L[i0 + r], delta[r]);
        }
        // dQ = scale dS K (overwrite), dK += scale dS^T Q, dV += P^T dO (the block's keys).
        block_times_keys(rows, D, keys, scale, dS, Kb, ldk, 0.f, dqp + base + i0 * ldq, ldq);
        block_add_transposed(keys, D, rows, scale, dS, Q, ldq, dK + klo * ldk, ldk);
        block_add_transposed(keys, D, rows, 1.f, P, dO, ldq, dV + klo * ldk, ldk);
      }
    }
  });
}

}  // namespace trainer::cpu
