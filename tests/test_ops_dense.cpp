// The dense CPU ops against float64 loops written here from
// docs/MODEL_MATH.md: each forward is compared with its float64 twin, and
// each backward with central finite differences of loss = sum(twin(x) * R)
// for a random R, the loss computed entirely in double.
//
// Differentiating the float64 twin rather than the fp32 op keeps fp32
// rounding out of the numerical gradient (it would be ~1e-3 of it at
// h = 1e-2 and worse for smaller h), so the tolerance can be tight enough to
// catch a small wrong term. The twin itself is pinned to the op by the
// forward comparison.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/half_float.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

using namespace trainer;
using test::fill_ints;
using test::fill_normal;
using test::Owned;

namespace {

using Ref = std::vector<double>;

// fp32 forwards must match the float64 twin to this relative error.
constexpr double kFwdTol = 1e-5;
// fp32 backwards must match float64 finite differences to this relative error
// (gradients are O(1); grad_check floors |g| at 1e-2).
constexpr double kGradTol = 1e-4;
// h = 2^-10: x +- h is exact in fp32 for |x| < 2^13, so the step really is
// 2h, and the truncation error h^2 f'''/6 is ~1e-7.
constexpr double kH = 1.0 / 1024;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

double weighted_sum(const Ref& out, const std::vector<float>& R) {
  double s = 0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * double(R[i]);
  return s;
}

// Finite differences with respect to x of sum(twin() * R); twin must read x.
double fd_check(const std::string& label, std::vector<float>& x, const std::vector<float>& analytic,
                const std::function<Ref()>& twin, const std::vector<float>& R,
                size_t max_points = 256) {
  return test::grad_check(
             label, x, analytic, [&] { return weighted_sum(twin(), R); }, kH, 1e-2, max_points)
      .max_rel_err;
}

// Elementwise relative error with |ref| floored at `floor`. The inputs are
// O(1), so an output that cancels to nearly zero (x cos - y sin, a dot
// product) carries an fp32 rounding error of ~1e-8 on the O(1) scale, not on
// its own; the default floor of 1e-2 judges such entries at 1% of the data
// scale. NaN counts as infinitely wrong. Prints the error.
double fwd_err(const std::string& label, const std::vector<float>& got, const Ref& ref,
               double floor = 1e-2) {
  REQUIRE(got.size() == ref.size());
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(double(got[i]) - ref[i]) / std::max(std::fabs(ref[i]), floor);
    m = std::max(m, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  }
  std::printf("[forward]   %-40s max_rel_err=%.3e\n", label.c_str(), m);
  return m;
}

std::vector<float> minus(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

bool any_nan(const std::vector<float>& v) {
  for (float x : v)
    if (std::isnan(x)) return true;
  return false;
}

}  // namespace

// ---- elementwise ------------------------------------------------------------

TEST_CASE("elementwise: fill, copy, add, add_inplace, scale_inplace", "[ops][dense]") {
  const int64_t n = 40000;  // above the parallel threshold
  Owned a({n}), b({n}), out({n});
  fill_normal(a.f, 1);
  fill_normal(b.f, 2);
  auto mismatches = [&](const std::vector<float>& got, auto expect) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += got[size_t(i)] != expect(size_t(i));
    return bad;
  };

  cpu::fill(out, 2.5f);
  REQUIRE(mismatches(out.f, [](size_t) { return 2.5f; }) == 0);

  cpu::copy(out, a);
  REQUIRE(out.f == a.f);

  cpu::add(out, a, b);
  REQUIRE(mismatches(out.f, [&](size_t i) { return a.f[i] + b.f[i]; }) == 0);
  const std::vector<float> sum1 = out.f;
  cpu::add(out, out, b);  // out aliasing an input
  REQUIRE(mismatches(out.f, [&](size_t i) { return sum1[i] + b.f[i]; }) == 0);

  const std::vector<float> a0 = a.f;
  cpu::add_inplace(a, b);
  REQUIRE(mismatches(a.f, [&](size_t i) { return a0[i] + b.f[i]; }) == 0);

  const std::vector<float> a1 = a.f;
  cpu::scale_inplace(a, -0.25f);
  REQUIRE(mismatches(a.f, [&](size_t i) { return a1[i] * -0.25f; }) == 0);

  Owned small({3});
  REQUIRE_THROWS_WITH(ops::add(out, a, small), "add: a [40000] vs b [3]");
  Owned ints({n}, DType::I32);
  test::require_rejected([&] { ops::copy(out, ints); }, {"copy: ", "dst F32 vs src I32"});
}

namespace {

// Every 16-bit pattern of `t` to F32 and back through ops::convert; the
// patterns that did not come back (NaNs need only stay NaN).
int64_t round_trip_misses(DType t, uint16_t nan_exponent) {
  std::vector<uint16_t> bits(65536), back(65536);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = uint16_t(i);
  std::vector<float> wide(65536);
  ops::convert(Tensor(wide.data(), DType::F32, {65536}), Tensor(bits.data(), t, {65536}));
  ops::convert(Tensor(back.data(), t, {65536}), Tensor(wide.data(), DType::F32, {65536}));
  int64_t misses = 0;
  for (size_t i = 0; i < bits.size(); ++i) {
    const bool nan = (bits[i] & nan_exponent) == nan_exponent && (bits[i] & ~nan_exponent & 0x7fffu) != 0;
    misses += nan ? !std::isnan(wide[i]) || (back[i] & nan_exponent) != nan_exponent : back[i] != bits[i];
  }
  return misses;
}

// Between each pair of neighbouring positive finite values of `t` (pattern
// k, k + 1, whose F32 midpoint is exact): the midpoint rounds to the even
// pattern, anything nearer a neighbour to it; the patterns that did not.
int64_t tie_misses(DType t, uint16_t largest, float (*widen)(uint16_t)) {
  std::vector<float> probes;
  std::vector<uint16_t> want;
  for (uint32_t k = 0; k < largest; ++k) {
    const float lo = widen(uint16_t(k)), hi = widen(uint16_t(k + 1)), mid = lo + (hi - lo) / 2;
    probes.insert(probes.end(), {std::nextafter(mid, 0.f), mid, std::nextafter(mid, hi)});
    want.insert(want.end(), {uint16_t(k), uint16_t(k % 2 ? k + 1 : k), uint16_t(k + 1)});
  }
  std::vector<uint16_t> got(probes.size());
  ops::convert(Tensor(got.data(), t, {int64_t(got.size())}), Tensor(probes.data(), DType::F32, {int64_t(probes.size())}));
  int64_t misses = 0;
  for (size_t i = 0; i < got.size(); ++i) misses += got[i] != want[i];
  return misses;
}

}  // namespace

// The CPU backend computes in F32, but a GPU run's BF16/F16 tensors staged in
// host memory (ZeRO-Offload, the host-staged backend's reductions) convert
// here, rounding as the GPU does (round to nearest even).
TEST_CASE("elementwise: convert F32 <-> BF16/F16 on the host rounds to nearest even", "[ops][dense][convert]") {
  CHECK(round_trip_misses(DType::BF16, 0x7f80) == 0);
  CHECK(round_trip_misses(DType::F16, 0x7c00) == 0);
  CHECK(tie_misses(DType::BF16, 0x7f7f, f32_from_bf16) == 0);  // up to bf16's largest finite value
  CHECK(tie_misses(DType::F16, 0x7bff, f32_from_f16) == 0);    // subnormals, normals, up to 65504
  // Past F16's largest finite value: halfway to the next power of two is infinity.
  std::vector<float> big = {65519.99f, 65520.f, -65520.f, 1e30f, -INFINITY};
  std::vector<uint16_t> h(big.size());
  ops::convert(Tensor(h.data(), DType::F16, {int64_t(h.size())}), Tensor(big.data(), DType::F32, {int64_t(big.size())}));
  CHECK(h == std::vector<uint16_t>{0x7bff, 0x7c00, 0xfc00, 0x7c00, 0xfc00});
  // BF16 -> F16 goes through F32: 1 + 2^-7 is exact in both.
  std::vector<uint16_t> b = {0x3f81}, f(1);
  ops::convert(Tensor(f.data(), DType::F16, {1}), Tensor(b.data(), DType::BF16, {1}));
  CHECK(f[0] == 0x3c08);
}

TEST_CASE("elementwise: sum_squares in double, NaN propagates", "[ops][dense]") {
  Owned x({100003});
  fill_normal(x.f, 3, 2.f);
  double ref = 0;
  for (float v : x.f) ref += double(v) * double(v);
  const double err = std::fabs(cpu::sum_squares(x) - ref) / ref;
  std::printf("[forward]   %-40s max_rel_err=%.3e\n", "sum_squares", err);
  REQUIRE(err < 1e-12);
  x.f[777] = kNaN;
  REQUIRE(std::isnan(cpu::sum_squares(x)));
}

TEST_CASE("checksum: the op's formula word by word, any bit flip changes it, thread count and dtype do not matter",
          "[ops][dense]") {
  // The reference: the formula of kernels/op_list.h written out serially,
  // byte by byte (no memcpy, no OpenMP), here in the test.
  auto reference = [](const unsigned char* p, int64_t bytes) {
    auto mix = [](uint64_t z) {
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      return z ^ (z >> 31);
    };
    uint64_t sum = 0;
    for (int64_t i = 0; 4 * i < bytes; ++i) {
      uint64_t w = 0;
      for (int k = 0; k < 4 && 4 * i + k < bytes; ++k) w |= uint64_t(p[4 * i + k]) << (8 * k);
      sum += mix(w + uint64_t(i) * 0x9E3779B97F4A7C15ull);
    }
    return mix(sum ^ mix(uint64_t(bytes)));
  };
  Owned x({300001});  // past OpenMP's threshold of 2^16 words
  fill_normal(x.f, 11, 1.f);
  const auto* bytes = reinterpret_cast<const unsigned char*>(x.f.data());
  const uint64_t base = ops::checksum(x);
  CHECK(base == reference(bytes, int64_t(x.f.size() * 4)));
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  CHECK(ops::checksum(x) == base);
  omp_set_num_threads(threads);
  // A BF16 tensor of odd length ends in half a word; its bytes are hashed as they are.
  const Tensor half(x.f.data(), DType::BF16, {7});
  CHECK(ops::checksum(half) == reference(bytes, 14));
  CHECK(ops::checksum(Tensor(x.f.data(), DType::F32, {0})) == reference(bytes, 0));
  // Every bit of the first, a middle and the last element, one at a time.
  int changed = 0, tried = 0;
  for (size_t at : {size_t(0), x.f.size() / 2, x.f.size() - 1})
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t w;
      std::memcpy(&w, &x.f[at], 4);
      w ^= 1u << bit;
      float saved = x.f[at];
      std::memcpy(&x.f[at], &w, 4);
      changed += ops::checksum(x) != base;
      ++tried;
      x.f[at] = saved;
    }
  std::printf("[checksum]  %d of %d single-bit flips change the checksum (required: all)\n", changed, tried);
  CHECK(changed == tried);
  CHECK(ops::checksum(x) == base);
  // Two words swapped: positions count.
  std::swap(x.f[1], x.f[2]);
  CHECK(ops::checksum(x) != base);
}

// ---- embedding --------------------------------------------------------------

TEST_CASE("embedding forward (= and +=) and backward", "[ops][dense]") {
  const int64_t V = 10, C = 6, N = 9;
  Owned table({V, C}), ids({N}, DType::I32), out({N, C}), R({N, C});
  fill_normal(table.f, 10);
  fill_normal(R.f, 11);
  ids.i = {3, 0, 9, 3, 3, 7, 0, 1, 3};  // repeats: backward must sum them
  auto twin = [&] {
    Ref r(static_cast<size_t>(N * C));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) r[n * C + c] = table.f[ids.i[n] * C + c];
    return r;
  };

  cpu::embedding_forward(out, ids, table, false, 0, V);
  REQUIRE(fwd_err("embedding_forward", out.f, twin()) == 0.0);

  Owned base({N, C});
  fill_normal(base.f, 12);
  out.f = base.f;
  cpu::embedding_forward(out, ids, table, true, 0, V);
  Ref acc = twin();
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += double(base.f[i]);
  REQUIRE(fwd_err("embedding_forward accumulate", out.f, acc) < kFwdTol);

  Owned dtable({V, C});
  fill_normal(dtable.f, 13);
  const std::vector<float> d0 = dtable.f;
  cpu::embedding_backward(dtable, ids, R, 0, V);
  REQUIRE(fd_check("embedding_backward dtable (+=)", table.f, minus(dtable.f, d0), twin, R.f) <
          kGradTol);

  ids.i[4] = int32_t(V);
  REQUIRE_THROWS_WITH(ops::embedding_forward(out, ids, table, false, 0, V),
                      "embedding_forward: id 10 at position 4 is outside the vocabulary [0, 10)");
}

// ---- norms ------------------------------------------------------------------

TEST_CASE("rmsnorm forward and backward", "[ops][dense]") {
  const int64_t N = 5, C = 24;
  const float eps = 1e-5f;
  Owned x({N, C}), w({C}), out({N, C}), rstd({N}), R({N, C});
  fill_normal(x.f, 20, 1.5f);
  fill_normal(w.f, 21);
  fill_normal(R.f, 22);
  Ref ref_r(static_cast<size_t>(N));
  auto twin = [&] {
    Ref y(static_cast<size_t>(N * C));
    for (int64_t n = 0; n < N; ++n) {
      double ss = 0;
      for (int64_t c = 0; c < C; ++c) ss += double(x.f[n * C + c]) * x.f[n * C + c];
      ref_r[n] = 1.0 / std::sqrt(ss / C + eps);
      for (int64_t c = 0; c < C; ++c) y[n * C + c] = x.f[n * C + c] * ref_r[n] * w.f[c];
    }
    return y;
  };

  cpu::rmsnorm_forward(out, rstd, x, w, eps);
  REQUIRE(fwd_err("rmsnorm_forward out", out.f, twin()) < kFwdTol);
  REQUIRE(fwd_err("rmsnorm_forward rstd", rstd.f, ref_r) < kFwdTol);

  // Both gradients accumulate: start from random contents.
  Owned dx({N, C}), dw({C});
  fill_normal(dx.f, 23);
  fill_normal(dw.f, 24);
  const std::vector<float> dx0 = dx.f, dw0 = dw.f;
  cpu::rmsnorm_backward(dx, dw, R, x, w, rstd);
  REQUIRE(fd_check("rmsnorm_backward dx (+=)", x.f, minus(dx.f, dx0), twin, R.f) < kGradTol);
  REQUIRE(fd_check("rmsnorm_backward dweight (+=)", w.f, minus(dw.f, dw0), twin, R.f) < kGradTol);

  Owned x2({4, 32}), w2({16}), o3({4, 32}), r3({4});
  REQUIRE_THROWS_WITH(ops::rmsnorm_forward(o3, r3, x2, w2, eps),
                      "rmsnorm_forward: x [4, 32] vs weight [16]");
}

TEST_CASE("layernorm forward and backward", "[ops][dense]") {
  const int64_t N = 6, C = 20;
  const float eps = 1e-5f;
  Owned x({N, C}), w({C}), bias({C}), out({N, C}), mean({N}), rstd({N}), R({N, C});
  fill_normal(x.f, 30, 2.f);
  for (int64_t c = 0; c < C; ++c) x.f[c] += 3.f;  // a row with a large mean
  fill_normal(w.f, 31);
  fill_normal(bias.f, 32);
  fill_normal(R.f, 33);
  Ref ref_m(static_cast<size_t>(N)), ref_r(static_cast<size_t>(N));
  auto twin = [&] {
    Ref y(static_cast<size_t>(N * C));
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += x.f[n * C + c];
      const double m = s / C;
      double v = 0;
      for (int64_t c = 0; c < C; ++c) v += (x.f[n * C + c] - m) * (x.f[n * C + c] - m);
      ref_m[n] = m;
      ref_r[n] = 1.0 / std::sqrt(v / C + eps);
      for (int64_t c = 0; c < C; ++c)
        y[n * C + c] = (x.f[n * C + c] - m) * ref_r[n] * w.f[c] + bias.f[c];
    }
    return y;
  };

  cpu::layernorm_forward(out, mean, rstd, x, w, bias, eps);
  REQUIRE(fwd_err("layernorm_forward out", out.f, twin()) < kFwdTol);
  REQUIRE(fwd_err("layernorm_forward mean", mean.f, ref_m) < kFwdTol);
  REQUIRE(fwd_err("layernorm_forward rstd", rstd.f, ref_r) < kFwdTol);

  Owned dx({N, C}), dw({C}), db({C});
  fill_normal(dx.f, 34);
  fill_normal(dw.f, 35);
  fill_normal(db.f, 36);
  const std::vector<float> dx0 = dx.f, dw0 = dw.f, db0 = db.f;
  cpu::layernorm_backward(dx, dw, db, R, x, w, mean, rstd);
  REQUIRE(fd_check("layernorm_backward dx (+=)", x.f, minus(dx.f, dx0), twin, R.f) < kGradTol);
  REQUIRE(fd_check("layernorm_backward dweight (+=)", w.f, minus(dw.f, dw0), twin, R.f) < kGradTol);
  REQUIRE(fd_check("layernorm_backward dbias (+=)", bias.f, minus(db.f, db0), twin, R.f) <
          kGradTol);
}

// ---- linear -----------------------------------------------------------------

namespace {

Ref linear_twin(const std::vector<float>& inp, const std::vector<float>& w, const float* bias,
                int64_t N, int64_t IC, int64_t OC) {
  Ref out(static_cast<size_t>(N * OC));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = bias ? bias[o] : 0.0;
      for (int64_t i = 0; i < IC; ++i) s += double(inp[n * IC + i]) * w[o * IC + i];
      out[n * OC + o] = s;
    }
  return out;
}

}  // namespace

TEST_CASE("linear forward, with and without bias", "[ops][dense]") {
  const int64_t B = 2, T = 3, IC = 7, OC = 5;
  Owned inp({B, T, IC}), w({OC, IC}), bias({OC}), out({B, T, OC});
  fill_normal(inp.f, 40);
  fill_normal(w.f, 41);
  fill_normal(bias.f, 42);
  for (bool with_bias : {true, false}) {
    out.f.assign(out.f.size(), kNaN);  // forward must overwrite
    cpu::linear_forward(out, inp, w, with_bias ? Tensor(bias) : Tensor());
    const Ref ref = linear_twin(inp.f, w.f, with_bias ? bias.f.data() : nullptr, B * T, IC, OC);
    REQUIRE(fwd_err(with_bias ? "linear_forward bias" : "linear_forward no bias", out.f, ref) <
            kFwdTol);
  }
  Owned bad({4, 6});
  REQUIRE_THROWS_WITH(ops::linear_forward(out, inp, bad, Tensor()),
                      "linear_forward: inp [2, 3, 7] vs weight [4, 6]");
}

TEST_CASE("linear backward: dinp overwrite or +=, dweight/dbias +=, empty dinp/dbias",
          "[ops][dense]") {
  const int64_t N = 6, IC = 7, OC = 5;
  Owned inp({N, IC}), w({OC, IC}), bias({OC}), R({N, OC});
  fill_normal(inp.f, 50);
  fill_normal(w.f, 51);
  fill_normal(bias.f, 52);
  fill_normal(R.f, 53);
  auto twin = [&] { return linear_twin(inp.f, w.f, bias.f.data(), N, IC, OC); };

  for (bool accumulate : {false, true}) {
    Owned dinp({N, IC}), dw({OC, IC}), db({OC});
    if (accumulate)
      fill_normal(dinp.f, 54);
    else
      dinp.f.assign(dinp.f.size(), kNaN);  // overwrite must not read it
    fill_normal(dw.f, 55);
    fill_normal(db.f, 56);
    const std::vector<float> dinp0 = dinp.f, dw0 = dw.f, db0 = db.f;
    cpu::linear_backward(dinp, dw, db, R, inp, w, accumulate);
    REQUIRE(!any_nan(dinp.f));
    const std::string tag = accumulate ? ", accumulate_dinp" : ", overwrite dinp";
    const auto ginp = accumulate ? minus(dinp.f, dinp0) : dinp.f;
    REQUIRE(fd_check("linear_backward dinp" + tag, inp.f, ginp, twin, R.f) < kGradTol);
    REQUIRE(fd_check("linear_backward dweight (+=)" + tag, w.f, minus(dw.f, dw0), twin, R.f) <
            kGradTol);
    REQUIRE(fd_check("linear_backward dbias (+=)" + tag, bias.f, minus(db.f, db0), twin, R.f) <
            kGradTol);
  }

  // Empty dinp and dbias are skipped and leave dweight as it would be.
  Owned dinp({N, IC}), dw_full({OC, IC}), db({OC}), dw_only({OC, IC});
  cpu::linear_backward(dinp, dw_full, db, R, inp, w, false);
  cpu::linear_backward(Tensor(), dw_only, Tensor(), R, inp, w, false);
  REQUIRE(dw_only.f == dw_full.f);

  Owned bad({N, IC + 1});
  REQUIRE_THROWS_WITH(ops::linear_backward(bad, dw_only, Tensor(), R, inp, w, false),
                      "linear_backward: dinp [6, 8] vs inp [6, 7]");
}

// ---- rope -------------------------------------------------------------------

TEST_CASE("rope forward and backward, in place", "[ops][dense][rope]") {
  const int64_t B = 2, T = 9, H = 3, D = 8;
  const float theta = 100.f;  // small theta: every pair turns noticeably within T
  Owned x({B, T, H, D}), out({B, T, H, D}), R({B, T, H, D});
  fill_normal(x.f, 60);
  fill_normal(R.f, 61);
  auto twin = [&] {
    Ref y(x.f.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < D / 2; ++i) {
            const int64_t o = ((b * T + t) * H + h) * D;
            const double a = t * std::pow(double(theta), -2.0 * i / D);
            const double x0 = x.f[o + i], x1 = x.f[o + i + D / 2];
            y[o + i] = x0 * std::cos(a) - x1 * std::sin(a);
            y[o + i + D / 2] = x0 * std::sin(a) + x1 * std::cos(a);
          }
    return y;
  };

  cpu::rope_forward(out, x, theta, 0);
  REQUIRE(fwd_err("rope_forward", out.f, twin()) < kFwdTol);
  Owned inplace({B, T, H, D});
  inplace.f = x.f;
  cpu::rope_forward(inplace, inplace, theta, 0);
  REQUIRE(inplace.f == out.f);

  Owned dx({B, T, H, D});
  cpu::rope_backward(dx, R, theta, 0);
  REQUIRE(fd_check("rope_backward dinp", x.f, dx.f, twin, R.f) < kGradTol);
  inplace.f = R.f;
  cpu::rope_backward(inplace, inplace, theta, 0);
  REQUIRE(inplace.f == dx.f);

  Owned odd({1, 2, 1, 5});
  test::require_rejected([&] { ops::rope_forward(odd, odd, theta, 0); },
                         {"rope_forward: ", "out [1, 2, 1, 5]: head dim D must be even"});
  test::require_rejected([&] { ops::rope_backward(dx, R, theta, -1); },
                         {"rope_backward: ", "pos_offset -1 must be >= 0"});
}

namespace {

// Elements of a that differ bitwise from b (sizes equal).
size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// Positions [k, k + T) of a [B, k + T, H, D] tensor, as a [B, T, H, D] one.
std::vector<float> last_positions(const std::vector<float>& whole, int64_t B, int64_t k, int64_t T,
                                  int64_t HD) {
  std::vector<float> part;
  for (int64_t b = 0; b < B; ++b) {
    const auto first = whole.begin() + (b * (k + T) + k) * HD;
    part.insert(part.end(), first, first + T * HD);
  }
  return part;
}

}  // namespace

// Context parallelism hands a rank positions [k, k + T) of each sequence; its
// rotation must be exactly the one those positions get in the whole sequence.
TEST_CASE("rope with a position offset: the last T positions of the whole, bit for bit",
          "[ops][dense][rope]") {
  const int64_t B = 2, T = 5, H = 3, D = 16;
  for (const float theta : {1e4f, 5e5f})
    for (const int64_t k : {int64_t(1), int64_t(7), int64_t(3000)}) {
      Owned whole({B, k + T, H, D}), whole_out({B, k + T, H, D});
      fill_normal(whole.f, 70 + uint64_t(k));
      Owned part({B, T, H, D}), part_out({B, T, H, D}), at_zero({B, T, H, D});
      const std::vector<float> chunk = last_positions(whole.f, B, k, T, H * D);
      std::copy(chunk.begin(), chunk.end(), part.f.begin());  // part.t views part.f

      ops::rope_forward(whole_out, whole, theta, 0);
      ops::rope_forward(part_out, part, theta, k);
      ops::rope_forward(at_zero, part, theta, 0);
      const std::vector<float> expect = last_positions(whole_out.f, B, k, T, H * D);
      const size_t diff = bit_differences(part_out.f, expect);
      // The offset must matter, or the comparison above proves nothing.
      const size_t moved = bit_differences(at_zero.f, expect);
      std::printf("[rope offset] forward  theta=%g k=%lld: %zu of %zu elements differ from the "
                  "whole (offset 0 instead: %zu)\n",
                  double(theta), (long long)k, diff, expect.size(), moved);
      CHECK(diff == 0);
      CHECK(moved > expect.size() / 2);

      // Backward: the gradient of the whole, restricted to the chunk.
      ops::rope_backward(whole_out, whole, theta, 0);
      ops::rope_backward(part_out, part, theta, k);
      const std::vector<float> expect_bwd = last_positions(whole_out.f, B, k, T, H * D);
      const size_t diff_bwd = bit_differences(part_out.f, expect_bwd);
      std::printf("[rope offset] backward theta=%g k=%lld: %zu of %zu elements differ\n",
                  double(theta), (long long)k, diff_bwd, expect_bwd.size());
      CHECK(diff_bwd == 0);
      CHECK(bit_differences(part_out.f, expect) > expect.size() / 2);  // not the forward again
    }
}

// RoPE scaling (kernels/rope_freqs.h) against the formulas written here
// another way round: by frequency thresholds instead of wavelengths, the
// base frequency through exp/log instead of pow.
TEST_CASE("rope scaling: linear and llama3 frequencies and rotations against values computed here",
          "[ops][dense][rope]") {
  const int64_t D = 16, half = D / 2;
  const double theta = 100.0, pi = 3.14159265358979323846;
  ops::Rope llama3{float(theta)};
  llama3.scaling = ops::RopeScaling::Llama3;
  llama3.factor = 8.0;
  llama3.low_freq_factor = 1.0;
  llama3.high_freq_factor = 4.0;
  llama3.original_max_pos = 64.0;
  ops::Rope linear{float(theta)};
  linear.scaling = ops::RopeScaling::Linear;
  linear.factor = 4.0;

  // Frequencies below 2 pi low / orig turn less than low_freq_factor times
  // over the pretraining context: divided; above 2 pi high / orig: kept.
  const double f_low = 2 * pi * llama3.low_freq_factor / llama3.original_max_pos;
  const double f_high = 2 * pi * llama3.high_freq_factor / llama3.original_max_pos;
  std::vector<double> want3(half), want_lin(half), want_none(half);
  int kept = 0, ramped = 0, divided = 0;
  for (int64_t i = 0; i < half; ++i) {
    const double f = std::exp(-(2.0 * double(i) / double(D)) * std::log(theta));
    want_none[size_t(i)] = f;
    want_lin[size_t(i)] = f / linear.factor;
    if (f < f_low) {
      want3[size_t(i)] = f / llama3.factor, ++divided;
    } else if (f > f_high) {
      want3[size_t(i)] = f, ++kept;
    } else {
      const double s = (llama3.original_max_pos * f / (2 * pi) - llama3.low_freq_factor) /
                       (llama3.high_freq_factor - llama3.low_freq_factor);
      want3[size_t(i)] = f * ((1 - s) / llama3.factor + s), ++ramped;
    }
  }
  // Every branch of llama3 is taken, or the comparison leaves one untested.
  std::printf("[rope scaling] llama3 D=%lld theta=%g: %d pairs kept, %d ramped, %d divided\n", (long long)D, theta,
              kept, ramped, divided);
  REQUIRE((kept > 0 && ramped > 0 && divided > 0));
  auto worst_rel = [](const std::vector<double>& a, const std::vector<double>& b) {
    double w = 0;
    for (size_t i = 0; i < a.size(); ++i) w = std::max(w, std::fabs(a[i] - b[i]) / std::fabs(b[i]));
    return w;
  };
  const double e_none = worst_rel(ops::rope_inv_freqs(D, ops::Rope(float(theta))), want_none);
  const double e_lin = worst_rel(ops::rope_inv_freqs(D, linear), want_lin);
  const double e3 = worst_rel(ops::rope_inv_freqs(D, llama3), want3);
  std::printf("[rope scaling] inv_freq worst relative error: none %.2e, linear %.2e, llama3 %.2e (tol 1e-12)\n",
              e_none, e_lin, e3);
  CHECK(e_none < 1e-12);
  CHECK(e_lin < 1e-12);
  CHECK(e3 < 1e-12);

  // The op rotates by those frequencies, forward and backward.
  const int64_t B = 2, T = 40, H = 2;
  Owned x({B, T, H, D}), out({B, T, H, D}), R({B, T, H, D}), dx({B, T, H, D}), plain({B, T, H, D});
  fill_normal(x.f, 62);
  fill_normal(R.f, 63);
  auto twin = [&] {
    Ref y(x.f.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const int64_t o = ((b * T + t) * H + h) * D;
            const double a = double(t) * want3[size_t(i)];
            const double x0 = x.f[o + i], x1 = x.f[o + i + half];
            y[o + i] = x0 * std::cos(a) - x1 * std::sin(a);
            y[o + i + half] = x0 * std::sin(a) + x1 * std::cos(a);
          }
    return y;
  };
  ops::rope_forward(out, x, llama3, 0);
  const double fwd = fwd_err("rope_forward llama3", out.f, twin());
  ops::rope_forward(plain, x, float(theta), 0);
  const double unscaled = fwd_err("rope_forward unscaled vs the llama3 twin", plain.f, twin());
  std::printf("[rope scaling] rope_forward llama3 vs twin: %.2e (tol %.0e); unscaled RoPE vs the same twin: %.2e\n",
              fwd, kFwdTol, unscaled);
  CHECK(fwd < kFwdTol);
  CHECK(unscaled > 1e3 * kFwdTol);  // the scaling reaches the rotation
  ops::rope_backward(dx, R, llama3, 0);
  CHECK(fd_check("rope_backward llama3 dinp", x.f, dx.f, twin, R.f) < kGradTol);

  // Explicit positions (context parallelism, decoding) rotate as an offset does.
  Owned part({B, 4, H, D}), a({B, 4, H, D}), b({B, 4, H, D});
  fill_normal(part.f, 64);
  Owned pos({4}, DType::I32);
  for (int32_t t = 0; t < 4; ++t) pos.i[size_t(t)] = 30 + t;
  ops::rope_forward(a, part, llama3, 30);
  ops::rope_forward_pos(b, part, llama3, pos);
  CHECK(bit_differences(a.f, b.f) == 0);
  ops::rope_backward(a, part, llama3, 30);
  ops::rope_backward_pos(b, part, llama3, pos);
  CHECK(bit_differences(a.f, b.f) == 0);

  // Linear scaling by 4 at position 4k is the unscaled rotation at k.
  Owned pos4({4}, DType::I32), pos1({4}, DType::I32);
  for (int32_t t = 0; t < 4; ++t) pos4.i[size_t(t)] = 4 * (3 + 5 * t), pos1.i[size_t(t)] = 3 + 5 * t;
  ops::rope_forward_pos(a, part, linear, pos4);
  ops::rope_forward_pos(b, part, float(theta), pos1);
  double lin_err = 0;
  for (size_t i = 0; i < a.f.size(); ++i) lin_err = std::max(lin_err, double(std::fabs(a.f[i] - b.f[i])));
  std::printf("[rope scaling] linear x4 at 4k vs unscaled at k: max |diff| %.2e (tol 1e-5)\n", lin_err);
  CHECK(lin_err < 1e-5);

  ops::Rope bad = llama3;
  bad.original_max_pos = 0;
  test::require_rejected([&] { ops::rope_forward(a, part, bad, 0); },
                         {"rope_forward: ", "llama3 scaling needs original_max_pos > 0"});
  bad = linear;
  bad.factor = 0;
  test::require_rejected([&] { ops::rope_forward(a, part, bad, 0); },
                         {"rope_forward: ", "linear scaling factor 0.000000 must be positive"});
}

// ---- attention --------------------------------------------------------------

namespace {

// float64 attention straight from the definition; lse [B,Hq,T].
void attention_twin(Ref& out, Ref& lse, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, int64_t B, int64_t T, int64_t Hq, int64_t Hkv,
                    int64_t D, bool causal) {
  out.assign(static_cast<size_t>(B * T * Hq * D), 0.0);
  lse.assign(static_cast<size_t>(B * Hq * T), 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = causal ? i + 1 : T;
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += double(q[((b * T + i) * Hq + h) * D + c]) * k[((b * T + j) * Hkv + g) * D + c];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < n; ++j) z += std::exp(s[j] - mx);
        lse[(b * Hq + h) * T + i] = mx + std::log(z);
        for (int64_t j = 0; j < n; ++j) {
          const double p = std::exp(s[j] - mx) / z;
          for (int64_t c = 0; c < D; ++c)
            out[((b * T + i) * Hq + h) * D + c] += p * v[((b * T + j) * Hkv + g) * D + c];
        }
      }
    }
}

void check_attention(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, bool causal,
                     size_t fd_points = 256) {
  const std::string tag = std::string(causal ? "causal" : "full") + " T=" + std::to_string(T) +
                          " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv);
  const uint64_t seed = uint64_t(T * 1000 + Hq * 10 + Hkv + (causal ? 7 : 0));
  Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), out({B, T, Hq, D}), lse({B, Hq, T}),
      R({B, T, Hq, D});
  fill_normal(q.f, seed + 1);
  fill_normal(k.f, seed + 2);
  fill_normal(v.f, seed + 3);
  fill_normal(R.f, seed + 4);
  Ref ref_lse;
  auto twin = [&] {
    Ref o;
    attention_twin(o, ref_lse, q.f, k.f, v.f, B, T, Hq, Hkv, D, causal);
    return o;
  };

  out.f.assign(out.f.size(), kNaN);
  cpu::attention_forward(out, lse, q, k, v, causal, 0, Tensor{});
  // out is a convex combination of T rows of v, each O(1): an fp32 sum over
  // the keys is good to ~sqrt(T) ulps of that O(1) scale, so entries that
  // cancel are judged with |ref| floored at 0.1.
  REQUIRE(fwd_err("attention_forward out " + tag, out.f, twin(), 0.1) < kFwdTol);
  REQUIRE(fwd_err("attention_forward lse " + tag, lse.f, ref_lse) < kFwdTol);

  Owned dq({B, T, Hq, D}), dk({B, T, Hkv, D}), dv({B, T, Hkv, D});
  dq.f.assign(dq.f.size(), kNaN);  // all three overwrite
  dk.f.assign(dk.f.size(), kNaN);
  dv.f.assign(dv.f.size(), kNaN);
  cpu::attention_backward(dq, dk, dv, R, q, k, v, out, lse, causal, 0, Tensor{});
  REQUIRE(!any_nan(dq.f));
  REQUIRE(!any_nan(dk.f));
  REQUIRE(!any_nan(dv.f));
  REQUIRE(fd_check("attention_backward dq " + tag, q.f, dq.f, twin, R.f, fd_points) < kGradTol);
  REQUIRE(fd_check("attention_backward dk " + tag, k.f, dk.f, twin, R.f, fd_points) < kGradTol);
  REQUIRE(fd_check("attention_backward dv " + tag, v.f, dv.f, twin, R.f, fd_points) < kGradTol);
}

}  // namespace

TEST_CASE("attention forward/backward: causal and full, grouped-query heads", "[ops][dense]") {
  for (bool causal : {true, false})
    for (int64_t T : {7, 13})
      for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {4, 1}})
        check_attention(2, T, Hq, Hkv, 8, causal);
}

TEST_CASE("attention with more query rows than one block", "[ops][dense]") {
  // The CPU kernel works in blocks of 64 query rows; 97 leaves a ragged tail.
  check_attention(1, 97, 4, 2, 8, true, 64);
  check_attention(1, 97, 2, 1, 8, false, 64);
}

TEST_CASE("attention large enough to run threaded", "[ops][dense]") {
  // B*Hq*T^2*D is above the kernel's threading threshold: (batch, head) pairs
  // run on OpenMP threads with single-threaded sgemm.
  check_attention(2, 160, 4, 2, 8, true, 16);
  check_attention(2, 160, 4, 2, 8, false, 16);

  // The same numbers as one thread (sequential pairs, OpenBLAS threads).
  const int64_t B = 2, T = 160, Hq = 4, Hkv = 2, D = 8;
  Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), R({B, T, Hq, D});
  fill_normal(q.f, 120);
  fill_normal(k.f, 121);
  fill_normal(v.f, 122);
  fill_normal(R.f, 123);
  struct Run {
    Owned out, lse, dq, dk, dv;
    Run(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D)
        : out({B, T, Hq, D}),
          lse({B, Hq, T}),
          dq({B, T, Hq, D}),
          dk({B, T, Hkv, D}),
          dv({B, T, Hkv, D}) {}
  };
  auto run = [&](Run& r) {
    cpu::attention_forward(r.out, r.lse, q, k, v, true, 0, Tensor{});
    cpu::attention_backward(r.dq, r.dk, r.dv, R, q, k, v, r.out, r.lse, true, 0, Tensor{});
  };
  Run threaded(B, T, Hq, Hkv, D), serial(B, T, Hq, Hkv, D);
  run(threaded);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  run(serial);
  omp_set_num_threads(saved);
  double worst = 0;
  auto diff = [&](const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  };
  diff(threaded.out.f, serial.out.f);
  diff(threaded.lse.f, serial.lse.f);
  diff(threaded.dq.f, serial.dq.f);
  diff(threaded.dk.f, serial.dk.f);
  diff(threaded.dv.f, serial.dv.f);
  std::printf("[threads]   %-40s max_abs_diff=%.3e (threads=%d)\n",
              "attention threaded vs 1 thread", worst, saved);
  REQUIRE(worst < 1e-5);
}

TEST_CASE("attention shape errors", "[ops][dense]") {
  Owned q({1, 5, 3, 4}), k({1, 5, 2, 4}), v({1, 5, 2, 4}), out({1, 5, 3, 4}), lse({1, 3, 5});
  REQUIRE_THROWS_WITH(
      ops::attention_forward(out, lse, q, k, v, true, 0, Tensor{}),
      "attention_forward: q [1, 5, 3, 4] vs k [1, 5, 2, 4]: Hq must be a multiple of Hkv");
  Owned k4({1, 5, 3, 4}), v4({1, 5, 3, 4}), lse_bad({1, 3, 4});
  REQUIRE_THROWS_WITH(ops::attention_forward(out, lse_bad, q, k4, v4, true, 0, Tensor{}),
                      "attention_forward: lse [1, 3, 4] vs q [1, 5, 3, 4]: expected [1, 3, 5]");
}

TEST_CASE("NaN inputs reach the outputs of attention and cross-entropy", "[ops][dense]") {
  // A NaN must never be laundered into a plausible number (the max over a row
  // skips NaN, so it has to travel through the exponentials).
  Owned q({1, 4, 2, 4}), k({1, 4, 1, 4}), v({1, 4, 1, 4}), out({1, 4, 2, 4}), lse({1, 2, 4});
  fill_normal(q.f, 130);
  fill_normal(k.f, 131);
  fill_normal(v.f, 132);
  k.f[4] = kNaN;  // key 1: every query row from 1 on sees it (causal)
  cpu::attention_forward(out, lse, q, k, v, true, 0, Tensor{});
  REQUIRE(!std::isnan(out.f[0]));  // row 0 sees key 0 only
  REQUIRE(std::isnan(out.f[3 * 2 * 4]));
  REQUIRE(std::isnan(lse.f[3]));

  Owned logits({2, 5}), targets({2}, DType::I32), losses({2});
  fill_normal(logits.f, 133);
  targets.i = {1, 2};
  logits.f[7] = kNaN;
  cpu::cross_entropy_forward_backward(losses, logits, logits, targets, 1.f);
  REQUIRE(!std::isnan(losses.f[0]));
  REQUIRE(std::isnan(losses.f[1]));
}

// ---- activations ------------------------------------------------------------

TEST_CASE("gelu forward and backward", "[ops][dense]") {
  const int64_t N = 300;
  Owned x({N}), out({N}), R({N});
  fill_normal(x.f, 70, 2.5f);
  x.f[0] = -9.f;  // deep tail, where 1 + tanh cancels in fp32
  x.f[1] = 6.f;
  x.f[2] = 0.f;
  fill_normal(R.f, 71);
  auto twin = [&] {
    Ref y(x.f.size());
    const double k = std::sqrt(2 / std::acos(-1.0));
    for (size_t i = 0; i < y.size(); ++i) {
      const double xi = x.f[i];
      y[i] = 0.5 * xi * (1 + std::tanh(k * (xi + 0.044715 * xi * xi * xi)));
    }
    return y;
  };
  cpu::gelu_forward(out, x);
  REQUIRE(fwd_err("gelu_forward", out.f, twin(), 1e-6) < kFwdTol);

  Owned dx({N});
  cpu::gelu_backward(dx, R, x);
  REQUIRE(fd_check("gelu_backward dinp", x.f, dx.f, twin, R.f) < kGradTol);
  Owned alias({N});
  alias.f = R.f;
  cpu::gelu_backward(alias, alias, x);
  REQUIRE(alias.f == dx.f);
}

TEST_CASE("swiglu forward and backward", "[ops][dense]") {
  const int64_t N = 4, F = 40;
  Owned gate({N, F}), up({N, F}), out({N, F}), R({N, F});
  fill_normal(gate.f, 80, 2.f);
  fill_normal(up.f, 81);
  fill_normal(R.f, 82);
  auto twin = [&] {
    Ref y(gate.f.size());
    for (size_t i = 0; i < y.size(); ++i) {
      const double a = gate.f[i];
      y[i] = a / (1 + std::exp(-a)) * up.f[i];
    }
    return y;
  };
  cpu::swiglu_forward(out, gate, up);
  REQUIRE(fwd_err("swiglu_forward", out.f, twin(), 1e-6) < kFwdTol);

  Owned dgate({N, F}), dup({N, F});
  cpu::swiglu_backward(dgate, dup, R, gate, up);
  REQUIRE(fd_check("swiglu_backward dgate", gate.f, dgate.f, twin, R.f) < kGradTol);
  REQUIRE(fd_check("swiglu_backward dup", up.f, dup.f, twin, R.f) < kGradTol);
}

// ---- cross-entropy ----------------------------------------------------------

TEST_CASE("cross-entropy: losses, dlogits, ignored targets, in place", "[ops][dense]") {
  const int64_t N = 7, V = 11;
  const float grad_scale = 0.37f;
  Owned logits({N, V}), targets({N}, DType::I32), losses({N}), dlogits({N, V});
  fill_normal(logits.f, 90, 3.f);
  fill_ints(targets.i, 91, 0, int(V));
  targets.i[2] = -1;
  targets.i[5] = -100;  // PyTorch's ignore_index is negative too
  auto twin = [&] {
    Ref l(static_cast<size_t>(N), 0.0);
    for (int64_t n = 0; n < N; ++n) {
      if (targets.i[n] < 0) continue;
      double z = 0;
      for (int64_t j = 0; j < V; ++j) z += std::exp(double(logits.f[n * V + j]));
      l[n] = std::log(z) - logits.f[n * V + targets.i[n]];
    }
    return l;
  };

  losses.f.assign(losses.f.size(), kNaN);
  dlogits.f.assign(dlogits.f.size(), kNaN);
  cpu::cross_entropy_forward_backward(losses, dlogits, logits, targets, grad_scale);
  REQUIRE(fwd_err("cross_entropy losses", losses.f, twin()) < kFwdTol);
  REQUIRE(losses.f[2] == 0.f);
  REQUIRE(losses.f[5] == 0.f);
  for (int64_t j = 0; j < V; ++j) REQUIRE(dlogits.f[2 * V + j] == 0.f);
  for (int64_t j = 0; j < V; ++j) REQUIRE(dlogits.f[5 * V + j] == 0.f);

  // dlogits is the gradient of grad_scale * sum(losses).
  const std::vector<float> Rs(static_cast<size_t>(N), grad_scale);
  REQUIRE(fd_check("cross_entropy dlogits", logits.f, dlogits.f, twin, Rs) < kGradTol);

  // Without dlogits only the losses are written.
  Owned l2({N});
  cpu::cross_entropy_forward_backward(l2, Tensor(), logits, targets, grad_scale);
  REQUIRE(l2.f == losses.f);

  // dlogits == logits: the same numbers as the out-of-place call.
  Owned inplace({N, V}), l3({N});
  inplace.f = logits.f;
  cpu::cross_entropy_forward_backward(l3, inplace, inplace, targets, grad_scale);
  REQUIRE(l3.f == losses.f);
  REQUIRE(inplace.f == dlogits.f);

  targets.i[3] = int32_t(V);
  REQUIRE_THROWS_WITH(
      ops::cross_entropy_forward_backward(losses, dlogits, logits, targets, grad_scale),
      "cross_entropy_forward_backward: target 11 at row 3 is outside the vocabulary [0, 11)");
}

// ---- AdamW ------------------------------------------------------------------

TEST_CASE("adamw: several steps against torch.optim.AdamW's formula in double", "[ops][dense]") {
  const int64_t n = 50;
  Owned p({n}), g({n}), m({n}), v({n});
  fill_normal(p.f, 100);
  Ref rp(p.f.begin(), p.f.end()), rm(static_cast<size_t>(n), 0.0), rv(static_cast<size_t>(n), 0.0);
  cpu::AdamWStep s{};
  s.beta1 = 0.9f;
  s.beta2 = 0.95f;
  s.eps = 1e-8f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.5f;
  for (int64_t step = 1; step <= 6; ++step) {
    fill_normal(g.f, uint64_t(100 + step), 0.1f);
    s.step = step;
    s.lr = 1e-2f / float(step);  // a schedule changes lr between steps
    cpu::adamw_update(p, g, m, v, s);
    // torch.optim.AdamW: decoupled decay, moments, bias-corrected update.
    const double lr = s.lr, b1 = s.beta1, b2 = s.beta2, eps = s.eps, wd = s.weight_decay;
    const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g.f[i]) * double(s.grad_scale);
      rp[i] *= 1 - lr * wd;
      rm[i] = b1 * rm[i] + (1 - b1) * gi;
      rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
      rp[i] -= lr / bc1 * rm[i] / (std::sqrt(rv[i]) / std::sqrt(bc2) + eps);
    }
    const std::string at = " step " + std::to_string(step);
    REQUIRE(fwd_err("adamw param" + at, p.f, rp) < kFwdTol);
    // The moments are ~|g| = 0.05 and ~g^2: floors at 1% of those scales.
    REQUIRE(fwd_err("adamw exp_avg" + at, m.f, rm, 5e-4) < kFwdTol);
    REQUIRE(fwd_err("adamw exp_avg_sq" + at, v.f, rv, 2.5e-5) < kFwdTol);
  }

  s.step = 0;
  test::require_rejected([&] { ops::adamw_update(p, g, m, v, s); },
                         {"adamw_update: ", "step 0 must be >= 1"});
}

// ZeroOptimizer updates all of a rank's pieces with one multi-tensor call; it
// must give each piece exactly what the single-tensor op gives it.
TEST_CASE("adamw_update_master_multi: the single-tensor updates bit for bit, overlaps refused",
          "[ops][dense]") {
  // A param that is its own master (adamw_update) and two with a separate
  // copy, each with its own weight decay; different step sizes and lengths.
  const int64_t sizes[] = {37, 1000, 5};
  const float decays[] = {0.1f, 0.f, 0.05f};
  const bool own_master[] = {true, false, false};
  struct Set {
    std::vector<std::unique_ptr<Owned>> p, w, g, m, v;
  };
  Set multi, single;
  for (Set* set : {&multi, &single})
    for (size_t i = 0; i < 3; ++i) {
      for (auto* list : {&set->p, &set->w, &set->g, &set->m, &set->v})
        list->push_back(std::make_unique<Owned>(std::initializer_list<int64_t>{sizes[i]}));
      fill_normal(set->w[i]->f, 110 + i, 0.02f);
      set->p[i]->f = set->w[i]->f;  // same size: copied into p's own storage
    }
  std::vector<std::vector<float>> initial;
  for (size_t i = 0; i < 3; ++i) initial.push_back(multi.w[i]->f);
  cpu::AdamWStep s{1e-2f, 0.9f, 0.95f, 1e-8f, /*weight_decay: unused*/ 7.f, 1, 0.5f};
  for (int64_t step = 1; step <= 3; ++step) {
    s.step = step;
    std::vector<Tensor> ps, ws, gs, ms, vs;
    for (size_t i = 0; i < 3; ++i) {
      fill_normal(multi.g[i]->f, uint64_t(120 + 10 * step) + i, 0.1f);
      single.g[i]->f = multi.g[i]->f;
      ps.push_back(own_master[i] ? multi.w[i]->t : multi.p[i]->t);
      ws.push_back(*multi.w[i]);
      gs.push_back(*multi.g[i]);
      ms.push_back(*multi.m[i]);
      vs.push_back(*multi.v[i]);
      cpu::AdamWStep one = s;
      one.weight_decay = decays[i];
      if (own_master[i])
        ops::adamw_update(*single.w[i], *single.g[i], *single.m[i], *single.v[i], one);
      else
        ops::adamw_update_master(*single.p[i], *single.w[i], *single.g[i], *single.m[i],
                                 *single.v[i], one);
    }
    ops::adamw_update_master_multi(ps, ws, gs, ms, vs, {decays[0], decays[1], decays[2]}, s);
    for (size_t i = 0; i < 3; ++i) {
      size_t diff = 0;
      for (auto [a, b] : {std::pair{&multi.p, &single.p}, std::pair{&multi.w, &single.w},
                          std::pair{&multi.m, &single.m}, std::pair{&multi.v, &single.v}})
        for (size_t k = 0; k < (*a)[i]->f.size(); ++k)
          diff += std::memcmp(&(*a)[i]->f[k], &(*b)[i]->f[k], sizeof(float)) != 0;
      std::printf("[adamw multi] step %lld tensor %zu (n=%lld, wd=%g%s): %zu values differ\n",
                  (long long)step, i, (long long)sizes[i], double(decays[i]),
                  own_master[i] ? ", param = master" : "", diff);
      CHECK(diff == 0);
    }
  }
  // The updates moved every weight (else equality would prove nothing).
  for (size_t i = 0; i < 3; ++i) CHECK(multi.w[i]->f != initial[i]);

  // Two tensors whose m arrays share elements: the backends update tensors
  // concurrently, so this is refused before anything runs.
  Owned big_m({64}), v1({32}), v2({32}), w1({32}), w2({32}), g1({32}), g2({32});
  const Tensor m1(big_m.f.data(), DType::F32, {32}), m2(big_m.f.data() + 16, DType::F32, {32});
  test::require_rejected(
      [&] {
        ops::adamw_update_master_multi({w1, w2}, {w1, w2}, {g1, g2}, {m1, m2}, {v1, v2},
                                       {0.f, 0.f}, s);
      },
      {"adamw_update_master_multi: ", "tensor 0 m [32] overlaps tensor 1 m [32]"});
  test::require_rejected(
      [&] { ops::adamw_update_master_multi({w1}, {w1, w2}, {g1}, {m1}, {v1}, {0.f}, s); },
      {"adamw_update_master_multi: ", "list lengths differ: params 1, masters 2"});
  test::require_rejected(
      [&] {
        ops::adamw_update_master_multi({w1, w2}, {w1, w2},
                                       {g1, Tensor(g2.f.data(), DType::F32, {16})}, {m1, v2},
                                       {v1, big_m.t.view({2, 32}).slice0(1, 2).view({32})},
                                       {0.f, 0.f}, s);
      },
      {"adamw_update_master_multi: tensor 1: ", "grad [16] vs master [32]"});
}
