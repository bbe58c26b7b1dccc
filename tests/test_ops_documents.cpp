// Separate documents in the attention ops of the CPU backend (kernels/op_list.h:
// doc_start, q_doc_start, rope at one position per token).
//
// The reference is each document on its own: a packed sequence's attention
// with doc_start must be, row for row, the causal attention of the document
// that row belongs to, computed alone, and its gradients the documents'
// gradients side by side. The positions ops with q_doc_start, run as a
// context-parallel ring of two zigzag ranks in one process, must give the
// whole sequence's attention with doc_start. Documents are cut at places no
// tile respects (lengths 1, 5, 12, 19, ...), with and without a window,
// with grouped-query heads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "tests/test_util.h"

using namespace trainer;
using test::fill_normal;

namespace {

// fp32 sums in another order: the same math, so errors stay near rounding.
constexpr double kTol = 2e-6;

double max_err(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double scale = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(double(got[i]) - double(ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return std::isnan(worst) ? std::numeric_limits<double>::infinity() : worst / std::max(scale, 1e-30);
}

Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::F32, dims); }
Tensor i32(std::vector<int32_t>& v, std::initializer_list<int64_t> dims) { return Tensor(v.data(), DType::I32, dims); }

struct Shape {
  int64_t B, T, Hq, Hkv, D;
};

// doc_start [B*T] from each sequence's document starts (0 first).
std::vector<int32_t> doc_starts(const Shape& s, const std::vector<std::vector<int64_t>>& starts) {
  std::vector<int32_t> ds(size_t(s.B * s.T));
  for (int64_t b = 0; b < s.B; ++b) {
    int32_t cur = 0;
    for (int64_t t = 0; t < s.T; ++t) {
      for (int64_t st : starts[size_t(b)])
        if (st <= t) cur = int32_t(std::max<int64_t>(cur, st));
      ds[size_t(b * s.T + t)] = cur;
    }
  }
  return ds;
}

// Rows [t0, t0 + n) of sequence b of x [B, T, W] into / out of a [1, n, W] buffer.
std::vector<float> rows_of(const std::vector<float>& x, int64_t T, int64_t W, int64_t b, int64_t t0, int64_t n) {
  return std::vector<float>(x.begin() + (b * T + t0) * W, x.begin() + (b * T + t0 + n) * W);
}
void put_rows(std::vector<float>& x, const std::vector<float>& part, int64_t T, int64_t W, int64_t b, int64_t t0) {
  std::copy(part.begin(), part.end(), x.begin() + (b * T + t0) * W);
}

struct Grads {
  std::vector<float> out, lse, dq, dk, dv;
};

Grads packed(const Shape& s, std::vector<float>& q, std::vector<float>& k, std::vector<float>& v,
             std::vector<float>& dout, std::vector<int32_t>& ds, int64_t window) {
  Grads g;
  g.out.assign(q.size(), 0.f);
  g.lse.assign(size_t(s.B * s.Hq * s.T), 0.f);
  g.dq.assign(q.size(), 0.f);
  g.dk.assign(k.size(), 0.f);
  g.dv.assign(v.size(), 0.f);
  const auto Q = f32(q, {s.B, s.T, s.Hq, s.D}), K = f32(k, {s.B, s.T, s.Hkv, s.D}), V = f32(v, {s.B, s.T, s.Hkv, s.D});
  const Tensor docs = i32(ds, {s.B, s.T});
  ops::attention_forward(f32(g.out, {s.B, s.T, s.Hq, s.D}), f32(g.lse, {s.B, s.Hq, s.T}), Q, K, V, true, window, docs);
  ops::attention_backward(f32(g.dq, {s.B, s.T, s.Hq, s.D}), f32(g.dk, {s.B, s.T, s.Hkv, s.D}),
                          f32(g.dv, {s.B, s.T, s.Hkv, s.D}), f32(dout, {s.B, s.T, s.Hq, s.D}), Q, K, V,
                          f32(g.out, {s.B, s.T, s.Hq, s.D}), f32(g.lse, {s.B, s.Hq, s.T}), true, window, docs);
  return g;
}

// Every document through the plain causal ops alone, put back in place.
Grads one_by_one(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                 const std::vector<float>& v, const std::vector<float>& dout,
                 const std::vector<std::vector<int64_t>>& starts, int64_t window) {
  Grads g;
  g.out.assign(q.size(), 0.f);
  g.lse.assign(size_t(s.B * s.Hq * s.T), 0.f);
  g.dq.assign(q.size(), 0.f);
  g.dk.assign(k.size(), 0.f);
  g.dv.assign(v.size(), 0.f);
  const int64_t Wq = s.Hq * s.D, Wk = s.Hkv * s.D;
  for (int64_t b = 0; b < s.B; ++b) {
    std::vector<int64_t> cut = starts[size_t(b)];
    cut.push_back(s.T);
    for (size_t d = 0; d + 1 < cut.size(); ++d) {
      const int64_t t0 = cut[d], n = cut[d + 1] - t0;
      if (n == 0) continue;
      auto dq_ = rows_of(q, s.T, Wq, b, t0, n), dk_ = rows_of(k, s.T, Wk, b, t0, n), dv_ = rows_of(v, s.T, Wk, b, t0, n);
      auto go = rows_of(dout, s.T, Wq, b, t0, n);
      std::vector<float> o(size_t(n * Wq)), l(size_t(s.Hq * n)), gq(dq_.size()), gk(dk_.size()), gv(dv_.size());
      const auto Q = f32(dq_, {1, n, s.Hq, s.D}), K = f32(dk_, {1, n, s.Hkv, s.D}), V = f32(dv_, {1, n, s.Hkv, s.D});
      ops::attention_forward(f32(o, {1, n, s.Hq, s.D}), f32(l, {1, s.Hq, n}), Q, K, V, true, window, Tensor{});
      ops::attention_backward(f32(gq, {1, n, s.Hq, s.D}), f32(gk, {1, n, s.Hkv, s.D}), f32(gv, {1, n, s.Hkv, s.D}),
                              f32(go, {1, n, s.Hq, s.D}), Q, K, V, f32(o, {1, n, s.Hq, s.D}),
                              f32(l, {1, s.Hq, n}), true, window, Tensor{});
      put_rows(g.out, o, s.T, Wq, b, t0);
      put_rows(g.dq, gq, s.T, Wq, b, t0);
      put_rows(g.dk, gk, s.T, Wk, b, t0);
      put_rows(g.dv, gv, s.T, Wk, b, t0);
      for (int64_t h = 0; h < s.Hq; ++h)
        std::copy_n(l.begin() + h * n, n, g.lse.begin() + (b * s.Hq + h) * s.T + t0);
    }
  }
  return g;
}

void compare(const char* label, const Grads& got, const Grads& ref) {
  const double eo = max_err(got.out, ref.out), el = max_err(got.lse, ref.lse), eq = max_err(got.dq, ref.dq),
               ek = max_err(got.dk, ref.dk), ev = max_err(got.dv, ref.dv);
  std::printf("[documents] %-44s out %.1e lse %.1e dq %.1e dk %.1e dv %.1e (tol %.0e)\n", label, eo, el, eq, ek, ev,
              kTol);
  CHECK(eo < kTol);
  CHECK(el < kTol);
  CHECK(eq < kTol);
  CHECK(ek < kTol);
  CHECK(ev < kTol);
}

}  // namespace

TEST_CASE("attention with doc_start is every document's causal attention alone", "[ops][documents]") {
  const Shape s{2, 71, 4, 2, 8};
  // Sequence 0: documents of 1, 5, 12, 1, 19 and 33 tokens; sequence 1: one document.
  const std::vector<std::vector<int64_t>> starts = {{0, 1, 6, 18, 19, 38}, {0}};
  std::vector<float> q(size_t(s.B * s.T * s.Hq * s.D)), k(size_t(s.B * s.T * s.Hkv * s.D)), v(k.size()),
      dout(q.size());
  fill_normal(q, 1);
  fill_normal(k, 2);
  fill_normal(v, 3);
  fill_normal(dout, 4);
  std::vector<int32_t> ds = doc_starts(s, starts);
  for (const int64_t window : {int64_t(0), int64_t(6)}) {
    const Grads got = packed(s, q, k, v, dout, ds, window);
    const Grads ref = one_by_one(s, q, k, v, dout, starts, window);
    compare(window ? "window 6, GQA 4/2, 2 x 71" : "no window, GQA 4/2, 2 x 71", got, ref);
  }
  // A doc_start of 0 everywhere is no document at all: the plain causal op, bit for bit.
  std::vector<int32_t> zero(ds.size(), 0);
  const Grads all = packed(s, q, k, v, dout, zero, 0);
  const Grads plain = one_by_one(s, q, k, v, dout, {{0}, {0}}, 0);
  CHECK(all.out == plain.out);
  CHECK(all.dq == plain.dq);
}

TEST_CASE("the positions ops with q_doc_start, as a ring of two zigzag ranks, give attention with doc_start",
          "[ops][documents][cp]") {
  const Shape s{2, 48, 4, 2, 8};
  const int64_t chunk = 12;  // 2 ranks x 2 chunks
  const std::vector<std::vector<int64_t>> starts = {{0, 7, 13, 30, 31}, {0, 25}};
  std::vector<float> q(size_t(s.B * s.T * s.Hq * s.D)), k(size_t(s.B * s.T * s.Hkv * s.D)), v(k.size()),
      dout(q.size());
  fill_normal(q, 5);
  fill_normal(k, 6);
  fill_normal(v, 7);
  fill_normal(dout, 8);
  std::vector<int32_t> ds = doc_starts(s, starts);
  const Grads ref = packed(s, q, k, v, dout, ds, 0);

  const int64_t Tl = 2 * chunk, Wq = s.Hq * s.D, Wk = s.Hkv * s.D;
  std::vector<std::vector<int32_t>> pos(2);
  for (int r = 0; r < 2; ++r)
    for (const int64_t c : {int64_t(r), int64_t(3 - r)})
      for (int64_t t = 0; t < chunk; ++t) pos[size_t(r)].push_back(int32_t(c * chunk + t));
  auto gather = [&](const std::vector<float>& x, int64_t W, int r) {
    std::vector<float> out;
    for (int64_t b = 0; b < s.B; ++b)
      for (int32_t p : pos[size_t(r)]) out.insert(out.end(), x.begin() + (b * s.T + p) * W, x.begin() + (b * s.T + p + 1) * W);
    return out;
  };
  Grads got;
  got.out.assign(q.size(), 0.f);
  got.dq.assign(q.size(), 0.f);
  got.dk.assign(k.size(), 0.f);
  got.dv.assign(v.size(), 0.f);
  std::vector<std::vector<float>> ql(2), kl(2), vl(2), gl(2), ol(2), ll(2), dkl(2), dvl(2);
  std::vector<std::vector<int32_t>> dsl(2);
  for (int r = 0; r < 2; ++r) {
    ql[r] = gather(q, Wq, r);
    kl[r] = gather(k, Wk, r);
    vl[r] = gather(v, Wk, r);
    gl[r] = gather(dout, Wq, r);
    for (int64_t b = 0; b < s.B; ++b)
      for (int32_t p : pos[size_t(r)]) dsl[r].push_back(ds[size_t(b * s.T + p)]);
    dkl[r].assign(kl[r].size(), 0.f);
    dvl[r].assign(vl[r].size(), 0.f);
  }
  for (int r = 0; r < 2; ++r) {
    ol[r].assign(ql[r].size(), 0.f);
    ll[r].assign(size_t(s.B * s.Hq * Tl), -INFINITY);
    std::vector<float> po(ol[r].size()), pl(ll[r].size());
    for (int src = 0; src < 2; ++src) {
      ops::attention_forward_pos(f32(po, {s.B, Tl, s.Hq, s.D}), f32(pl, {s.B, s.Hq, Tl}), f32(ql[r], {s.B, Tl, s.Hq, s.D}),
                                 f32(kl[src], {s.B, Tl, s.Hkv, s.D}), f32(vl[src], {s.B, Tl, s.Hkv, s.D}),
                                 i32(pos[r], {Tl}), i32(pos[src], {Tl}), 0, i32(dsl[r], {s.B, Tl}));
      ops::attention_merge(f32(ol[r], {s.B, Tl, s.Hq, s.D}), f32(ll[r], {s.B, s.Hq, Tl}), f32(po, {s.B, Tl, s.Hq, s.D}),
                           f32(pl, {s.B, s.Hq, Tl}));
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::vector<float> dq(ql[r].size(), 0.f);
    for (int src = 0; src < 2; ++src)
      ops::attention_backward_pos(f32(dq, {s.B, Tl, s.Hq, s.D}), f32(dkl[src], {s.B, Tl, s.Hkv, s.D}),
                                  f32(dvl[src], {s.B, Tl, s.Hkv, s.D}), f32(gl[r], {s.B, Tl, s.Hq, s.D}),
                                  f32(ql[r], {s.B, Tl, s.Hq, s.D}), f32(kl[src], {s.B, Tl, s.Hkv, s.D}),
                                  f32(vl[src], {s.B, Tl, s.Hkv, s.D}), f32(ol[r], {s.B, Tl, s.Hq, s.D}),
                                  f32(ll[r], {s.B, s.Hq, Tl}), i32(pos[r], {Tl}), i32(pos[src], {Tl}), 0,
                                  i32(dsl[r], {s.B, Tl}));
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t l = 0; l < Tl; ++l) {
        const int64_t p = pos[size_t(r)][size_t(l)];
        std::copy_n(ol[r].begin() + (b * Tl + l) * Wq, Wq, got.out.begin() + (b * s.T + p) * Wq);
        std::copy_n(dq.begin() + (b * Tl + l) * Wq, Wq, got.dq.begin() + (b * s.T + p) * Wq);
      }
  }
  for (int r = 0; r < 2; ++r)
    for (int64_t b = 0; b < s.B; ++b)
      for (int64_t l = 0; l < Tl; ++l) {
        const int64_t p = pos[size_t(r)][size_t(l)];
        std::copy_n(dkl[r].begin() + (b * Tl + l) * Wk, Wk, got.dk.begin() + (b * s.T + p) * Wk);
        std::copy_n(dvl[r].begin() + (b * Tl + l) * Wk, Wk, got.dv.begin() + (b * s.T + p) * Wk);
      }
  got.lse = ref.lse;  // the ring's lse is checked through out and the gradients, which read it
  compare("ring of 2 zigzag ranks, 2 x 48", got, ref);
}

TEST_CASE("rope at one position per token turns each row as rope at its own positions", "[ops][documents]") {
  const int64_t B = 2, T = 9, H = 3, D = 8;
  std::vector<float> x(size_t(B * T * H * D)), y(x.size()), ref(x.size());
  fill_normal(x, 9);
  std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0, 1, 2, 3, 5, 6, 7, 8, 0, 1, 2, 3, 4};
  const ops::Rope rope{10000.0};
  ops::rope_forward_pos(f32(y, {B, T, H, D}), f32(x, {B, T, H, D}), rope, i32(pos, {B, T}));
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> row(pos.begin() + b * T, pos.begin() + (b + 1) * T);
    auto xb = rows_of(x, T, H * D, b, 0, T);
    std::vector<float> yb(xb.size());
    ops::rope_forward_pos(f32(yb, {1, T, H, D}), f32(xb, {1, T, H, D}), rope, i32(row, {T}));
    put_rows(ref, yb, T, H * D, b, 0);
  }
  CHECK(y == ref);
  std::vector<float> back(x.size());
  ops::rope_backward_pos(f32(back, {B, T, H, D}), f32(y, {B, T, H, D}), rope, i32(pos, {B, T}));
  const double e = max_err(back, x);
  std::printf("[documents] rope [B, T] positions: forward bit for bit per row, backward(forward(x)) vs x %.1e\n", e);
  CHECK(e < 1e-6);
}

TEST_CASE("doc_start of the wrong shape or without causal is refused, naming it", "[ops][documents]") {
  std::vector<float> q(2 * 5 * 2 * 4), lse(2 * 2 * 5);
  std::vector<int32_t> ds(9), ok(10);
  const Tensor Q = f32(q, {2, 5, 2, 4}), L = f32(lse, {2, 2, 5});
  test::require_rejected([&] { ops::attention_forward(Q, L, Q, Q, Q, true, 0, i32(ds, {9})); },
                         {"attention_forward: ", "doc_start [9] vs q [2, 5, 2, 4]: expected [2, 5]"});
  test::require_rejected([&] { ops::attention_forward(Q, L, Q, Q, Q, false, 0, i32(ok, {2, 5})); },
                         {"attention_forward: ", "doc_start (separate documents) needs causal = true"});
  std::vector<int32_t> pos(5);
  test::require_rejected(
      [&] { ops::attention_forward_pos(Q, L, Q, Q, Q, i32(pos, {5}), i32(pos, {5}), 0, i32(ds, {9})); },
      {"attention_forward_pos: ", "q_doc_start [9] vs q [2, 5, 2, 4]"});
  test::require_rejected([&] { ops::rope_forward_pos(Q, Q, ops::Rope{10000.0}, i32(ds, {9})); },
                         {"rope_forward_pos: ", "pos [9] vs inp [2, 5, 2, 4]"});
}
