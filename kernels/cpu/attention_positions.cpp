// Attention at explicit token positions and the merge of partial attentions,
// CPU backend (see kernels/op_list.h): the pieces of ring attention, where a
// context-parallel rank attends its queries to one K/V block at a time and
// merges the partial results by their log-sum-exp.
//
// The work is attention.cpp's (the same blocks of kBlock query rows through
// sgemm, the same row softmax from attention_math.h), with the causal prefix
// replaced by what the positions make visible. Per query row i the visible
// keys {j : k_pos[j] <= q_pos[i], and q_pos[i] - k_pos[j] <= W under a window
// W > 0} are described by their span [lo, hi) (first
// and one past the last visible key) and whether the span has holes; a
// block's sgemm covers the union of its rows' spans only, so blocks of keys
// no row can see cost nothing (in a zigzag ring half the blocks of a step are
// skipped whole), and inside a row the softmax runs over the span, holes
// masked. With identity positions every span is [max(0, i - W), i + 1)
// without holes and a block covers keys [max(0, i0 - W), i0 + rows): exactly
// attention.cpp's causal calls, so the results are the same bits. A window
// also makes a block of keys that every row has left behind cost nothing.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/attention_math.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

using namespace attention_math;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t B, Tq, Tk, Hq, Hkv, D;
};

// Shapes are checked by the router (kernels/checks/attention_positions.cpp).
Dims dims(const char* op, const Tensor& q, const Tensor& k) {
  const Dims d{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  if (d.Tq > INT_MAX / 2 || d.Tk > INT_MAX / 2 || d.Hq * d.D > INT_MAX)
    checks::fail(op, "q " + q.shape_str() + " k " + k.shape_str() +
                         " are too large for a 32-bit BLAS");
  return d;
}

// The keys query row i sees: a subset of [lo, hi); holes: some key inside
// the span is not visible (then each key is tested). lo == hi: none.
struct Span {
  int64_t lo = 0, hi = 0;
  bool holes = false;
};

// Key position kp visible from query position qp (window 0: none).
inline bool visible(int32_t qp, int32_t kp, int64_t window) {
  return kp <= qp && (window <= 0 || int64_t(qp) - kp <= window);
}

std::vector<Span> spans(const int32_t* q_pos, int64_t Tq, const int32_t* k_pos, int64_t Tk, int64_t window) {
  std::vector<Span> s(static_cast<size_t>(Tq));
  for (int64_t i = 0; i < Tq; ++i) {
    const int32_t p = q_pos[i];
    int64_t lo = -1, hi = -1, seen = 0;
    for (int64_t j = 0; j < Tk; ++j)
      if (visible(p, k_pos[j], window)) {
        if (lo < 0) lo = j;
        hi = j + 1;
        ++seen;
      }
    if (lo >= 0) s[size_t(i)] = Span{lo, hi, seen != hi - lo};
  }
  return s;
}

// The keys [klo, khi) that some row of [i0, i0 + rows) sees (klo == khi: none);
// rows with skip(i) are left out.
template <typename Skip>
void block_keys(const std::vector<Span>& sp, int64_t i0, int64_t rows, Skip skip, int64_t& klo,
                int64_t& khi) {
  klo = LLONG_MAX;
  khi = LLONG_MIN;
  for (int64_t r = 0; r < rows; ++r) {
    const Span& s = sp[size_t(i0 + r)];
    if (s.lo == s.hi || skip(i0 + r)) continue;
    klo = std::min(klo, s.lo);
    khi = std::max(khi, s.hi);
  }
  if (klo > khi) klo = khi = 0;
}

}  // namespace

void attention_forward_pos(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor q_pos,
                           Tensor k_pos, int64_t window) {
  const char* op = "attention_forward_pos";
  need_f32(op, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}});
  const auto [B, Tq, Tk, Hq, Hkv, D] = dims(op, q, k);
  if (B == 0 || Tq == 0 || Hq == 0) return;
  const int64_t group = Hq / Hkv, ldq = Hq * D, ldk = Hkv * D;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *op_ = out.f32(), *lp = lse.f32();
  const int32_t *qpos = q_pos.i32(), *kpos = k_pos.i32();
  const std::vector<Span> sp = spans(qpos, Tq, kpos, Tk, window);

  const int64_t pairs = B * Hq;
  const int threads = threads_for(pairs, pairs * Tq * Tk * D);
  const int64_t scratch = kBlock * Tk;
  std::vector<float> S(size_t(threads * scratch));
  SerialBlas serial(threads > 1);
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t b = p / Hq, h = p % Hq, g = h / group;
    const float* Q = qp + b * Tq * ldq + h * D;
    const float* K = kp + b * Tk * ldk + g * D;
    const float* V = vp + b * Tk * ldk + g * D;
    float* O = op_ + b * Tq * ldq + h * D;
    float* L = lp + (b * Hq + h) * Tq;
    float* s = S.data() + omp_get_thread_num() * scratch;
    for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
      const int64_t rows = std::min(kBlock, Tq - i0);
      int64_t klo, khi;
      block_keys(sp, i0, rows, [](int64_t) { return false; }, klo, khi);
      const int64_t keys = khi - klo;
      if (keys > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(D), scale,
                    Q + i0 * ldq, int(ldq), K + klo * ldk, int(ldk), 0.f, s, int(keys));
      }
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const Span& span = sp[size_t(i)];
        if (span.lo == span.hi) {
          L[i] = kNegInf;
          if (keys > 0) std::fill(s + r * keys, s + (r + 1) * keys, 0.f);
          continue;
        }
        float* row = s + r * keys;
        const int64_t a = span.lo - klo, n = span.hi - span.lo;
        float* x = row + a;
        if (span.holes)
          for (int64_t j = 0; j < n; ++j)
            if (!visible(qpos[i], kpos[span.lo + j], window)) x[j] = kNegInf;
        const float mx = row_max(x, n);
        const double sum = exp_sum_into(x, x, n, mx);
        const float inv = float(1.0 / sum);
        for (int64_t j = 0; j < n; ++j) x[j] *= inv;
        std::fill(row, x, 0.f);
        std::fill(x + n, row + keys, 0.f);
        L[i] = float(double(mx) + std::log(sum));
      }
      if (keys > 0) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(D), int(keys), 1.f,
                    s, int(keys), V + klo * ldk, int(ldk), 0.f, O + i0 * ldq, int(ldq));
      }
      // A row that sees no key is 0 whatever v holds (0 * inf would be NaN).
      for (int64_t r = 0; r < rows; ++r) {
        const Span& span = sp[size_t(i0 + r)];
        if (span.lo == span.hi) std::memset(O + (i0 + r) * ldq, 0, size_t(D) * sizeof(float));
      }
    }
  }
}

void attention_merge(Tensor out, Tensor lse, Tensor part_out, Tensor part_lse) {
  const char* op = "attention_merge";
  need_f32(op, {{"out", &out}, {"part_out", &part_out}});
  const int64_t B = out.dim(0), T = out.dim(1), H = out.dim(2), D = out.dim(3);
  const int64_t rows = B * T * H;
  if (rows == 0) return;
  float* o = out.f32();
  float* l = lse.f32();
  const float* po = part_out.f32();
  const float* pl = part_lse.f32();
  constexpr double kInf = std::numeric_limits<double>::infinity();
#pragma omp parallel for if (rows * D >= (1 << 15))
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t h = row % H, bt = row / H, t = bt % T, b = bt / T;
    const int64_t li = (b * H + h) * T + t;
    const double l1 = l[li], l2 = pl[li];
    float* x = o + row * D;
    const float* y = po + row * D;
    if (std::isnan(l1) || std::isnan(l2)) {
      l[li] = std::numeric_limits<float>::quiet_NaN();
      std::fill(x, x + D, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const double m = std::max(l1, l2);
    if (m == -kInf) {  // neither has seen a key
      l[li] = float(-kInf);
      std::fill(x, x + D, 0.f);
      continue;
    }
    // logaddexp in double; each weight is exp(l - lse') <= 1, and a side at
    // -inf weighs exactly 0, so merging into the empty start copies the part.
    const double merged = m + std::log1p(std::exp(std::min(l1, l2) - m));
    const double w1 = std::exp(l1 - merged), w2 = std::exp(l2 - merged);
    for (int64_t d = 0; d < D; ++d)
      x[d] = float((w1 == 0 ? 0.0 : w1 * double(x[d])) + (w2 == 0 ? 0.0 : w2 * double(y[d])));
    l[li] = float(merged);
  }
}

void attention_backward_pos(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                            Tensor v, Tensor out, Tensor lse, Tensor q_pos, Tensor k_pos,
                            int64_t window) {
  const char* op = "attention_backward_pos";
  need_f32(op, {{"dq", &dq},
                {"dk", &dk},
                {"dv", &dv},
                {"dout", &dout},
                {"q", &q},
                {"k", &k},
                {"v", &v},
                {"out", &out}});
  const auto [B, Tq, Tk, Hq, Hkv, D] = dims(op, q, k);
  if (B == 0 || Tq == 0 || Tk == 0 || Hq == 0) return;
  const int64_t group = Hq / Hkv, ldq = Hq * D, ldk = Hkv * D;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32(), *gp = dout.f32(), *outp = out.f32(),
              *lp = lse.f32();
  float *dqp = dq.f32(), *dkp = dk.f32(), *dvp = dv.f32();
  const int32_t *qpos = q_pos.i32(), *kpos = k_pos.i32();
  const std::vector<Span> sp = spans(qpos, Tq, kpos, Tk, window);

  // As attention_backward: one thread owns a kv head and every query head
  // that reads it, so dk, dv (and those heads' dq) are summed without atomics
  // and in a fixed order.
  const int64_t pairs = B * Hkv;
  const int threads = threads_for(pairs, B * Hq * Tq * Tk * D);
  const int64_t scratch = 2 * kBlock * Tk + kBlock;
  std::vector<float> S(size_t(threads * scratch));
  SerialBlas serial(threads > 1);
#pragma omp parallel for num_threads(threads) schedule(dynamic)
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t b = p / Hkv, g = p % Hkv;
    const float* K = kp + b * Tk * ldk + g * D;
    const float* V = vp + b * Tk * ldk + g * D;
    float* dK = dkp + b * Tk * ldk + g * D;
    float* dV = dvp + b * Tk * ldk + g * D;
    float* P = S.data() + omp_get_thread_num() * scratch;
    float* dS = P + kBlock * Tk;
    float* delta = dS + kBlock * Tk;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const int64_t base = b * Tq * ldq + h * D;
      const float* L = lp + (b * Hq + h) * Tq;
      // A row whose final lse is -inf saw no key in any block: it adds nothing.
      auto dead = [&](int64_t i) { return L[i] == kNegInf; };
      for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
        const int64_t rows = std::min(kBlock, Tq - i0);
        int64_t klo, khi;
        block_keys(sp, i0, rows, dead, klo, khi);
        const int64_t keys = khi - klo;
        if (keys == 0) continue;
        const float* Q = qp + base + i0 * ldq;
        const float* dO = gp + base + i0 * ldq;
        // delta_i = sum_j P_ij dP_ij = dO_i . O_i (the softmax Jacobian term).
        for (int64_t r = 0; r < rows; ++r) {
          const float* o = outp + base + (i0 + r) * ldq;
          const float* go = dO + r * ldq;
          delta[r] = float(lane_sum(D, [=](int64_t d) { return double(go[d]) * o[d]; }));
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(D), scale, Q,
                    int(ldq), K + klo * ldk, int(ldk), 0.f, P, int(keys));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(D), 1.f, dO,
                    int(ldq), V + klo * ldk, int(ldk), 0.f, dS, int(keys));
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          float* pr = P + r * keys;
          float* dr = dS + r * keys;
          const Span& span = sp[size_t(i)];
          if (span.lo == span.hi || dead(i)) {
            std::fill(pr, pr + keys, 0.f);
            std::fill(dr, dr + keys, 0.f);
            continue;
          }
          const int64_t a = span.lo - klo, n = span.hi - span.lo;
          const float l = L[i];
          const float dl = delta[r];
          float* x = pr + a;
          float* y = dr + a;
          softmax_grad_row(x, y, n, l, dl);
          if (span.holes)
            for (int64_t j = 0; j < n; ++j)
              if (!visible(qpos[i], kpos[span.lo + j], window)) x[j] = y[j] = 0.f;
          std::fill(pr, x, 0.f);
          std::fill(x + n, pr + keys, 0.f);
          std::fill(dr, y, 0.f);
          std::fill(y + n, dr + keys, 0.f);
        }
        // dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO (this block's keys).
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(D), int(keys), scale,
                    dS, int(keys), K + klo * ldk, int(ldk), 1.f, dqp + base + i0 * ldq, int(ldq));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(keys), int(D), int(rows), scale,
                    dS, int(keys), Q, int(ldq), 1.f, dK + klo * ldk, int(ldk));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(keys), int(D), int(rows), 1.f, P,
                    int(keys), dO, int(ldq), 1.f, dV + klo * ldk, int(ldk));
      }
    }
  }
}

}  // namespace trainer::cpu
