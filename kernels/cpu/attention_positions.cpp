// Attention at explicit token positions and the merge of partial attentions,
// CPU backend (see kernels/op_list.h): the pieces of ring attention, where a
// context-parallel rank attends its queries to one K/V block at a time and
// merges the partial results by their log-sum-exp.
//
// The work is attention.cpp's (the same blocks of kBlock query rows through
// sgemm and the same row softmax, attention_math.h; the same threads,
// attention_threads.h), with the causal prefix replaced by what the
// positions make visible. Per query row i the visible
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
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/attention_math.h"
#include "kernels/cpu/attention_threads.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

using namespace attention_math;
using namespace attention_threads;

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

// Key position kp visible from query position qp (window 0: none) whose
// document starts at position first (INT32_MIN: no documents).
inline bool visible(int32_t qp, int32_t kp, int64_t window, int32_t first) {
  return kp <= qp && kp >= first && (window <= 0 || int64_t(qp) - kp <= window);
}

// Per query row of batch row b's sequence: its document's first position.
struct DocFirst {
  const int32_t* ds = nullptr;  // [B, Tq] or null
  int64_t Tq = 0;
  int32_t of(int64_t b, int64_t i) const { return ds ? ds[b * Tq + i] : INT32_MIN; }
};

// The spans of every query row: [Tq] shared by the batch rows, or [B, Tq]
// with documents (each sequence has its own); row(b) finds batch row b's.
struct Spans {
  std::vector<Span> s;
  int64_t Tq = 0;
  bool per_batch = false;
  const Span* row(int64_t b) const { return s.data() + (per_batch ? b * Tq : 0); }
};

std::vector<Span> spans_of(const int32_t* q_pos, int64_t Tq, const int32_t* k_pos, int64_t Tk, int64_t window,
                           const DocFirst& first, int64_t b) {
  std::vector<Span> s(static_cast<size_t>(Tq));
  for (int64_t i = 0; i < Tq; ++i) {
    const int32_t p = q_pos[i], f = first.of(b, i);
    int64_t lo = -1, hi = -1, seen = 0;
    for (int64_t j = 0; j < Tk; ++j)
      if (visible(p, k_pos[j], window, f)) {
        if (lo < 0) lo = j;
        hi = j + 1;
        ++seen;
      }
    if (lo >= 0) s[size_t(i)] = Span{lo, hi, seen != hi - lo};
  }
  return s;
}

Spans spans(const int32_t* q_pos, int64_t Tq, const int32_t* k_pos, int64_t Tk, int64_t window,
            const DocFirst& first, int64_t B) {
  Spans out;
  out.Tq = Tq;
  out.per_batch = first.ds != nullptr;
  for (int64_t b = 0; b < (out.per_batch ? B : 1); ++b) {
    std::vector<Span> one = spans_of(q_pos, Tq, k_pos, Tk, window, first, b);
    out.s.insert(out.s.end(), one.begin(), one.end());
  }
  return out;
}

// The keys [klo, khi) that some row of [i0, i0 + rows) sees (klo == khi: none);
// rows with skip(i) are left out.
template <typename Skip>
void block_keys(const Span* sp, int64_t i0, int64_t rows, Skip skip, int64_t& klo,
                int64_t& khi) {
  klo = LLONG_MAX;
  khi = LLONG_MIN;
  for (int64_t r = 0; r < rows; ++r) {
    const Span& s = sp[i0 + r];
    if (s.lo == s.hi || skip(i0 + r)) continue;
    klo = std::min(klo, s.lo);
    khi = std::max(khi, s.hi);
  }
  if (klo > khi) klo = khi = 0;
}

}  // namespace

void attention_forward_pos(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, Tensor q_pos,
                           Tensor k_pos, int64_t window, Tensor q_doc_start) {
  const char* op = "attention_forward_pos";
  need_f32(op, {{"out", &out}, {"q", &q}, {"k", &k}, {"v", &v}});
  const auto [B, Tq, Tk, Hq, Hkv, D] = dims(op, q, k);
  if (B == 0 || Tq == 0 || Hq == 0) return;
  const int64_t group = Hq / Hkv, ldq = Hq * D, ldk = Hkv * D;
  const float scale = float(1.0 / std::sqrt(double(D)));
  const float *qp = q.f32(), *kp = k.f32(), *vp = v.f32();
  float *op_ = out.f32(), *lp = lse.f32();
  const int32_t *qpos = q_pos.i32(), *kpos = k_pos.i32();
  const DocFirst first{q_doc_start.empty() ? nullptr : q_doc_start.i32(), Tq};
  const Spans all = spans(qpos, Tq, kpos, Tk, window, first, B);

  const int64_t pairs = B * Hq;
  for_each_pair(pairs, pairs * Tq * Tk * D, kBlock * Tk, [&](int64_t p, float* s) {
    const int64_t b = p / Hq, h = p % Hq, g = h / group;
    const float* Q = qp + b * Tq * ldq + h * D;
    const float* K = kp + b * Tk * ldk + g * D;
    const float* V = vp + b * Tk * ldk + g * D;
    float* O = op_ + b * Tq * ldq + h * D;
    float* L = lp + (b * Hq + h) * Tq;
    const Span* sp = all.row(b);
    for (int64_t i0 = 0; i0 < Tq; i0 += kBlock) {
      const int64_t rows = std::min(kBlock, Tq - i0);
      int64_t klo, khi;
      block_keys(sp, i0, rows, [](int64_t) { return false; }, klo, khi);
      const int64_t keys = khi - klo;
      if (keys > 0) block_scores(rows, keys, D, scale, Q + i0 * ldq, ldq, K + klo * ldk, ldk, s);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        const Span& span = sp[i];
        if (span.lo == span.hi) {
          L[i] = kNegInf;
          if (keys > 0) std::fill(s + r * keys, s + (r + 1) * keys, 0.f);
          continue;
        }
        float* row = s + r * keys;
        const int64_t a = span.lo - klo, n = span.hi - span.lo;
        if (span.holes)
          for (int64_t j = 0; j < n; ++j)
            if (!visible(qpos[i], kpos[span.lo + j], window, first.of(b, i))) row[a + j] = kNegInf;
        L[i] = softmax_row(row, keys, a, n);
      }
      if (keys > 0) block_times_keys(rows, D, keys, 1.f, s, V + klo * ldk, ldk, 0.f, O + i0 * ldq, ldq);
      // A row that sees no key is 0 whatever v holds (0 * inf would be NaN).
      for (int64_t r = 0; r < rows; ++r) {
        const Span& span = sp[i0 + r];
        if (span.lo == span.hi) std::memset(O + (i0 + r) * ldq, 0, size_t(D) * sizeof(float));
      }
    }
  });
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
                            int64_t window, Tensor q_doc_start) {
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
  const DocFirst first{q_doc_start.empty() ? nullptr : q_doc_start.i32(), Tq};
  const Spans all = spans(qpos, Tq, kpos, Tk, window, first, B);

  // As attention_backward: one thread owns a kv head and every query head
  // that reads it, so dk, dv (and those heads' dq) are summed without atomics
  // and in a fixed order.
  const int64_t pairs = B * Hkv;
  for_each_pair(pairs, B * Hq * Tq * Tk * D, 2 * kBlock * Tk + kBlock, [&](int64_t p, float* P) {
    const int64_t b = p / Hkv, g = p % Hkv;
    const float* K = kp + b * Tk * ldk + g * D;
    const float* V = vp + b * Tk * ldk + g * D;
    float* dK = dkp + b * Tk * ldk + g * D;
    float* dV = dvp + b * Tk * ldk + g * D;
    float* dS = P + kBlock * Tk;
    float* delta = dS + kBlock * Tk;
    const Span* sp = all.row(b);
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
        row_deltas(delta, rows, dO, outp + base + i0 * ldq, ldq, D);
        block_scores(rows, keys, D, scale, Q, ldq, K + klo * ldk, ldk, P);
        block_scores(rows, keys, D, 1.f, dO, ldq, V + klo * ldk, ldk, dS);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          float* pr = P + r * keys;
          float* dr = dS + r * keys;
          const Span& span = sp[i];
          if (span.lo == span.hi || dead(i)) {
            std::fill(pr, pr + keys, 0.f);
            std::fill(dr, dr + keys, 0.f);
            continue;
          }
          const int64_t a = span.lo - klo, n = span.hi - span.lo;
          softmax_grad_block_row(pr, dr, keys, a, n, L[i], delta[r]);
          // softmax_grad_block_row zeroes the keys outside the span; the
          // holes inside it the row does not see are zeroed here.
          if (span.holes)
            for (int64_t j = 0; j < n; ++j)
              if (!visible(qpos[i], kpos[span.lo + j], window, first.of(b, i))) pr[a + j] = dr[a + j] = 0.f;
        }
        // dQ += scale dS K, dK += scale dS^T Q, dV += P^T dO (this block's keys).
        block_times_keys(rows, D, keys, scale, dS, K + klo * ldk, ldk, 1.f, dqp + base + i0 * ldq, ldq);
        block_add_transposed(keys, D, rows, scale, dS, Q, ldq, dK + klo * ldk, ldk);
        block_add_transposed(keys, D, rows, 1.f, P, dO, ldq, dV + klo * ldk, ldk);
      }
    }
  });
}

}  // namespace trainer::cpu
