// Sliding-window attention on the CPU (model.sliding_window; the `window`
// argument of attention_forward / attention_backward and of their
// explicit-position twins, kernels/op_list.h): query i sees keys
// max(0, i - W) .. i. Every kernel result is compared with a plain O(T^2)
// softmax in float64 that applies the mask from that definition alone, and
// every gradient with central differences of it; windows shorter than one
// CPU block (64 query rows) and longer, equal to the sequence and past it,
// with grouped-query heads. A window that leaves nothing out must be causal
// attention bit for bit, and the explicit-position op at identity positions
// attention_forward / attention_backward bit for bit (the ring's pieces and
// the whole compute the same thing the same way).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/test_util.h"

using namespace trainer;
using test::fill_normal;
using test::Owned;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFwdTol = 1e-5;   // fp32 against float64, relative to the largest element
constexpr double kGradTol = 1e-4;  // analytic against central differences

// Visible from the definition: causal by position, and within W back (W = 0: no window).
bool sees(int64_t qp, int64_t kp, int64_t W) { return kp <= qp && (W == 0 || qp - kp <= W); }

// float64 attention at positions with the window mask; lse -inf and out 0 for
// a row that sees nothing. Identity positions give the whole sequence's.
void twin(std::vector<double>& out, std::vector<double>& lse, const std::vector<float>& q,
          const std::vector<float>& k, const std::vector<float>& v, int64_t B, int64_t Tq, int64_t Tk,
          int64_t Hq, int64_t Hkv, int64_t D, const std::vector<int32_t>& qpos,
          const std::vector<int32_t>& kpos, int64_t W) {
  out.assign(size_t(B * Tq * Hq * D), 0.0);
  lse.assign(size_t(B * Hq * Tq), -kInf);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = 0; i < Tq; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < Tk; ++j) {
          if (!sees(qpos[size_t(i)], kpos[size_t(j)], W)) continue;
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += double(q[size_t(((b * Tq + i) * Hq + h) * D + c)]) * k[size_t(((b * Tk + j) * Hkv + g) * D + c)];
          s[size_t(j)] = d * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        if (mx == -kInf) continue;
        double z = 0;
        for (int64_t j = 0; j < Tk; ++j)
          if (sees(qpos[size_t(i)], kpos[size_t(j)], W)) z += std::exp(s[size_t(j)] - mx);
        lse[size_t((b * Hq + h) * Tq + i)] = mx + std::log(z);
        for (int64_t j = 0; j < Tk; ++j) {
          if (!sees(qpos[size_t(i)], kpos[size_t(j)], W)) continue;
          const double p = std::exp(s[size_t(j)] - mx) / z;
          for (int64_t c = 0; c < D; ++c)
            out[size_t(((b * Tq + i) * Hq + h) * D + c)] += p * v[size_t(((b * Tk + j) * Hkv + g) * D + c)];
        }
      }
    }
}

std::vector<int32_t> identity(int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// max |got - ref| / max(max |ref|, floor); infinities must match exactly, NaN fails.
double rel_err(const std::vector<float>& got, const std::vector<double>& ref, double floor = 0) {
  REQUIRE(got.size() == ref.size());
  double worst = 0, scale = floor;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (double(got[i]) != ref[i]) return kInf;
      continue;
    }
    const double e = std::fabs(double(got[i]) - ref[i]);
    if (std::isnan(e)) return kInf;
    worst = std::max(worst, e);
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return scale > 0 ? worst / scale : worst;
}

size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// Forward against the twin, backward against its central differences.
void check_window(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t W, size_t fd_points) {
  char tag[96];
  std::snprintf(tag, sizeof tag, "T=%lld W=%lld Hq=%lld Hkv=%lld", (long long)T, (long long)W, (long long)Hq,
                (long long)Hkv);
  const uint64_t seed = uint64_t(T * 1000 + W * 10 + Hq + Hkv);
  Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), R({B, T, Hq, D});
  fill_normal(q.f, seed + 1);
  fill_normal(k.f, seed + 2);
  fill_normal(v.f, seed + 3);
  fill_normal(R.f, seed + 4);
  const std::vector<int32_t> pos = identity(T);
  std::vector<double> ref_out, ref_lse;
  twin(ref_out, ref_lse, q.f, k.f, v.f, B, T, T, Hq, Hkv, D, pos, pos, W);

  Owned out({B, T, Hq, D}), lse({B, Hq, T});
  out.f.assign(out.f.size(), kNaN);
  lse.f.assign(lse.f.size(), kNaN);
  ops::attention_forward(out, lse, q, k, v, true, W, Tensor{});
  // out is a convex combination of rows of v, each O(1): entries that cancel
  // are judged on that scale (floor 0.1), as the causal test does.
  const double e_out = rel_err(out.f, ref_out, 0.1), e_lse = rel_err(lse.f, ref_lse);
  std::printf("[window]    forward  %-32s out max_rel_err=%.3e lse max_rel_err=%.3e (float64 masked reference)\n", tag,
              e_out, e_lse);
  CHECK(e_out < kFwdTol);
  CHECK(e_lse < kFwdTol);

  Owned dq({B, T, Hq, D}), dk({B, T, Hkv, D}), dv({B, T, Hkv, D});
  dq.f.assign(dq.f.size(), kNaN);  // all three overwrite
  dk.f.assign(dk.f.size(), kNaN);
  dv.f.assign(dv.f.size(), kNaN);
  ops::attention_backward(dq, dk, dv, R, q, k, v, out, lse, true, W, Tensor{});
  auto loss = [&] {
    std::vector<double> o, l;
    twin(o, l, q.f, k.f, v.f, B, T, T, Hq, Hkv, D, pos, pos, W);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * double(R.f[i]);
    return s;
  };
  constexpr double kH = 1.0 / 1024;
  const std::string t = tag;
  CHECK(test::grad_check("window dq " + t, q.f, dq.f, loss, kH, 1e-2, fd_points).max_rel_err < kGradTol);
  CHECK(test::grad_check("window dk " + t, k.f, dk.f, loss, kH, 1e-2, fd_points).max_rel_err < kGradTol);
  CHECK(test::grad_check("window dv " + t, v.f, dv.f, loss, kH, 1e-2, fd_points).max_rel_err < kGradTol);
}

}  // namespace

TEST_CASE("sliding-window attention: forward and backward against a float64 masked reference",
          "[ops][window]") {
  // T = 13: one CPU block; windows shorter than T, T - 1 and T (nothing left
  // out) and past T.
  for (const int64_t W : {1, 4, 12, 13, 20})
    for (const auto& [Hq, Hkv] : {std::pair<int64_t, int64_t>{4, 2}, {4, 1}, {2, 2}})
      check_window(2, 13, Hq, Hkv, 8, W, 256);
  // T = 97: two blocks of 64 query rows (the second ragged); windows inside
  // one block, across the block edge, and the whole sequence.
  for (const int64_t W : {5, 64, 70, 97}) check_window(1, 97, 4, 2, 8, W, 48);
}

TEST_CASE("sliding-window attention with threads: the same as the float64 reference", "[ops][window]") {
  // B*Hq*T*(W+1)*D above the kernel's threading threshold.
  check_window(2, 160, 4, 2, 8, 40, 16);
}

TEST_CASE("a window that leaves no key out is causal attention, bit for bit", "[ops][window]") {
  const int64_t B = 2, T = 97, Hq = 4, Hkv = 2, D = 8;
  Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), R({B, T, Hq, D});
  fill_normal(q.f, 41);
  fill_normal(k.f, 42);
  fill_normal(v.f, 43);
  fill_normal(R.f, 44);
  Owned out0({B, T, Hq, D}), lse0({B, Hq, T}), dq0({B, T, Hq, D}), dk0({B, T, Hkv, D}), dv0({B, T, Hkv, D});
  ops::attention_forward(out0, lse0, q, k, v, true, 0, Tensor{});
  ops::attention_backward(dq0, dk0, dv0, R, q, k, v, out0, lse0, true, 0, Tensor{});
  for (const int64_t W : {T - 1, T, int64_t(1) << 40}) {
    Owned out({B, T, Hq, D}), lse({B, Hq, T}), dq({B, T, Hq, D}), dk({B, T, Hkv, D}), dv({B, T, Hkv, D});
    ops::attention_forward(out, lse, q, k, v, true, W, Tensor{});
    ops::attention_backward(dq, dk, dv, R, q, k, v, out, lse, true, W, Tensor{});
    const size_t d = bit_differences(out.f, out0.f) + bit_differences(lse.f, lse0.f) +
                     bit_differences(dq.f, dq0.f) + bit_differences(dk.f, dk0.f) + bit_differences(dv.f, dv0.f);
    std::printf("[window]    W=%lld at T=%lld vs no window: %zu elements of out/lse/dq/dk/dv differ\n", (long long)W,
                (long long)T, d);
    CHECK(d == 0);
  }
  // And a window that does leave keys out changes the result (the test above
  // is not blind).
  Owned out({B, T, Hq, D}), lse({B, Hq, T});
  ops::attention_forward(out, lse, q, k, v, true, T - 2, Tensor{});
  CHECK(bit_differences(out.f, out0.f) > 0);
}

TEST_CASE("attention_forward_pos at identity positions with a window is attention_forward with it, bit for bit",
          "[ops][window][cp]") {
  for (const int64_t T : {13, 97, 160})
    for (const int64_t W : {3, 40}) {
      const int64_t B = 2, Hq = 4, Hkv = 2, D = 16;
      const uint64_t seed = 900 + uint64_t(T + W);
      Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), dout({B, T, Hq, D});
      fill_normal(q.f, seed);
      fill_normal(k.f, seed + 1);
      fill_normal(v.f, seed + 2);
      fill_normal(dout.f, seed + 3);
      Owned pos({T}, DType::I32);
      std::iota(pos.i.begin(), pos.i.end(), 0);
      Owned out({B, T, Hq, D}), lse({B, Hq, T}), out_p({B, T, Hq, D}), lse_p({B, Hq, T});
      ops::attention_forward(out, lse, q, k, v, true, W, Tensor{});
      ops::attention_forward_pos(out_p, lse_p, q, k, v, pos, pos, W, Tensor{});
      Owned dq({B, T, Hq, D}), dk({B, T, Hkv, D}), dv({B, T, Hkv, D});
      Owned dq_p({B, T, Hq, D}), dk_p({B, T, Hkv, D}), dv_p({B, T, Hkv, D});  // zeroed: the op accumulates
      ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, true, W, Tensor{});
      ops::attention_backward_pos(dq_p, dk_p, dv_p, dout, q, k, v, out, lse, pos, pos, W, Tensor{});
      const size_t f = bit_differences(out_p.f, out.f) + bit_differences(lse_p.f, lse.f);
      const size_t g = bit_differences(dq_p.f, dq.f) + bit_differences(dk_p.f, dk.f) + bit_differences(dv_p.f, dv.f);
      std::printf("[window]    identity positions T=%-4lld W=%-3lld forward %zu, backward %zu elements differ\n",
                  (long long)T, (long long)W, f, g);
      CHECK(f == 0);
      CHECK(g == 0);
    }
}

TEST_CASE("attention_forward_pos with a window at scattered positions: float64 twin, empty rows, gradients",
          "[ops][window][cp]") {
  // The positions of the ring test's scattered case, with a window of 4:
  // positions 0 and 1 see no key (the first is at 2), 40 none either (its
  // window 36..40 holds no key), 5 sees keys 4 and 2 but not 30 between
  // them (a hole); nobody sees the keys at 35 and 50.
  const int64_t B = 2, Tq = 11, Tk = 9, Hq = 4, Hkv = 2, D = 8, W = 4;
  Owned q({B, Tq, Hq, D}), k({B, Tk, Hkv, D}), v({B, Tk, Hkv, D}), R({B, Tq, Hq, D});
  fill_normal(q.f, 611);
  fill_normal(k.f, 612);
  fill_normal(v.f, 613);
  fill_normal(R.f, 614);
  Owned qpos({Tq}, DType::I32), kpos({Tk}, DType::I32);
  qpos.i = {3, 40, 0, 17, 2, 25, 9, 1, 33, 12, 5};
  kpos.i = {10, 4, 30, 2, 22, 8, 35, 15, 50};
  std::vector<double> ref_out, ref_lse;
  twin(ref_out, ref_lse, q.f, k.f, v.f, B, Tq, Tk, Hq, Hkv, D, qpos.i, kpos.i, W);
  Owned out({B, Tq, Hq, D}), lse({B, Hq, Tq});
  out.f.assign(out.f.size(), kNaN);
  lse.f.assign(lse.f.size(), kNaN);
  ops::attention_forward_pos(out, lse, q, k, v, qpos, kpos, W, Tensor{});
  const double e_out = rel_err(out.f, ref_out), e_lse = rel_err(lse.f, ref_lse);
  const auto empty = std::count(lse.f.begin(), lse.f.end(), -std::numeric_limits<float>::infinity());
  std::printf("[window]    scattered positions W=%lld: out max_rel_err=%.3e lse max_rel_err=%.3e; %lld of %zu rows "
              "see no key\n",
              (long long)W, e_out, e_lse, (long long)empty, lse.f.size());
  CHECK(e_out < kFwdTol);
  CHECK(e_lse < kFwdTol);
  CHECK(empty == B * Hq * 3);
  for (int64_t b = 0; b < B; ++b)
    for (const int64_t i : {1, 2, 7})  // positions 40, 0, 1
      for (int64_t c = 0; c < Hq * D; ++c) CHECK(out.f[size_t((b * Tq + i) * Hq * D + c)] == 0.f);

  Owned dq({B, Tq, Hq, D}), dk({B, Tk, Hkv, D}), dv({B, Tk, Hkv, D});
  ops::attention_backward_pos(dq, dk, dv, R, q, k, v, out, lse, qpos, kpos, W, Tensor{});
  auto loss = [&] {
    std::vector<double> o, l;
    twin(o, l, q.f, k.f, v.f, B, Tq, Tk, Hq, Hkv, D, qpos.i, kpos.i, W);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * double(R.f[i]);
    return s;
  };
  constexpr double kH = 1.0 / 1024;
  CHECK(test::grad_check("window dq (scattered)", q.f, dq.f, loss, kH).max_rel_err < kGradTol);
  CHECK(test::grad_check("window dk (scattered)", k.f, dk.f, loss, kH).max_rel_err < kGradTol);
  CHECK(test::grad_check("window dv (scattered)", v.f, dv.f, loss, kH).max_rel_err < kGradTol);
  // Keys nobody sees (positions 35 and 50: indices 6 and 8) get no gradient.
  for (int64_t b = 0; b < B; ++b)
    for (const int64_t j : {6, 8})
      for (int64_t c = 0; c < Hkv * D; ++c) {
        CHECK(dk.f[size_t((b * Tk + j) * Hkv * D + c)] == 0.f);
        CHECK(dv.f[size_t((b * Tk + j) * Hkv * D + c)] == 0.f);
      }
}

TEST_CASE("a NaN key reaches only the queries whose window holds it", "[ops][window]") {
  const int64_t B = 1, T = 20, Hq = 2, Hkv = 1, D = 4, W = 3, bad = 5;
  Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), pos({T}, DType::I32);
  fill_normal(q.f, 51);
  fill_normal(k.f, 52);
  fill_normal(v.f, 53);
  std::iota(pos.i.begin(), pos.i.end(), 0);
  k.f[size_t(bad * Hkv * D)] = kNaN;
  for (const bool positions : {false, true}) {
    Owned out({B, T, Hq, D}), lse({B, Hq, T});
    if (positions)
      ops::attention_forward_pos(out, lse, q, k, v, pos, pos, W, Tensor{});
    else
      ops::attention_forward(out, lse, q, k, v, true, W, Tensor{});
    int64_t wrong = 0;
    for (int64_t i = 0; i < T; ++i) {
      const bool expect_nan = i >= bad && i <= bad + W;
      for (int64_t c = 0; c < Hq * D; ++c) wrong += std::isnan(out.f[size_t(i * Hq * D + c)]) != expect_nan;
    }
    std::printf("[window]    NaN in key %lld, W=%lld (%s): %lld output elements wrong (want NaN exactly in rows "
                "%lld..%lld)\n",
                (long long)bad, (long long)W, positions ? "attention_forward_pos" : "attention_forward",
                (long long)wrong, (long long)bad, (long long)(bad + W));
    CHECK(wrong == 0);
  }
}

TEST_CASE("window argument errors name the op and the value", "[ops][window]") {
  Owned q({1, 5, 2, 4}), k({1, 5, 1, 4}), v({1, 5, 1, 4}), out({1, 5, 2, 4}), lse({1, 2, 5}), pos({5}, DType::I32);
  test::require_rejected([&] { ops::attention_forward(out, lse, q, k, v, true, -1, Tensor{}); },
                         {"attention_forward", "window -1 must be >= 0"});
  test::require_rejected([&] { ops::attention_forward(out, lse, q, k, v, false, 3, Tensor{}); },
                         {"attention_forward", "window 3 needs causal = true"});
  test::require_rejected([&] { ops::attention_backward(q, k, v, out, q, k, v, out, lse, false, 2, Tensor{}); },
                         {"attention_backward", "window 2 needs causal = true"});
  test::require_rejected([&] { ops::attention_forward_pos(out, lse, q, k, v, pos, pos, -2, Tensor{}); },
                         {"attention_forward_pos", "window -2 must be >= 0"});
  test::require_rejected([&] { ops::attention_backward_pos(q, k, v, out, q, k, v, out, lse, pos, pos, -3, Tensor{}); },
                         {"attention_backward_pos", "window -3 must be >= 0"});
}
