// The ops of ring attention (context parallelism) on the CPU:
// attention_forward_pos, attention_merge, attention_backward_pos and
// rope_forward_pos / rope_backward_pos (kernels/op_list.h).
//
// The main check runs the whole ring in one process. A sequence of T tokens
// is cut into 2*cp chunks; virtual rank r holds chunks r and 2cp-1-r
// (zigzag), concatenated, with their global positions. At ring step s rank r
// attends its queries to the K/V block of rank (r - s) mod cp and merges the
// partial result into its running (out, lse), starting from (0, -inf). The
// ranks' outputs put back in place must be attention_forward(causal) of the
// whole sequence; the backward ring (dq accumulated by the rank, dk/dv of a
// block accumulated into its owner's buffers) must be attention_backward of
// the whole. Chunk lengths (5, 7, 37) are multiples of no tile.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "model/context_parallel.h"
#include "tests/test_util.h"

using namespace trainer;
using test::fill_normal;
using test::Owned;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The ring against the whole sequence: every output within this relative
// error (see rel_err).
constexpr double kRingTol = 1e-5;

// The error of an output, relative to its largest element:
//   max_i |got_i - ref_i| / max_j |ref_j|
// (the convention of the stage tests). Both sides are fp32 sums in different
// orders, so an element that cancels to nearly zero carries rounding noise on
// the tensor's scale, not its own; elem_err below shows the per-element view.
// Infinities must match exactly (an -inf lse where the reference has one);
// NaN anywhere counts as infinitely wrong.
double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double scale = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(ref[i]) || std::isinf(got[i])) {
      if (got[i] != ref[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    const double e = std::fabs(double(got[i]) - double(ref[i]));
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, e);
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

// Per element: max_i |got_i - ref_i| / max(|ref_i|, 1e-2 max_j |ref_j|),
// printed next to rel_err (an element at 1% of the scale with an absolute
// error of 1e-7 of the scale shows as 1e-5 here). Finite entries only.
double elem_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double scale = 0;
  for (float r : ref)
    if (std::isfinite(r)) scale = std::max(scale, double(std::fabs(r)));
  const double floor = std::max(1e-2 * scale, 1e-30);
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::isfinite(ref[i]))
      m = std::max(m, std::fabs(double(got[i]) - double(ref[i])) /
                          std::max(std::fabs(double(ref[i])), floor));
  return m;
}

size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

bool any_nan(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

// Global positions of zigzag rank r: chunk r, then chunk 2cp-1-r.
std::vector<int32_t> zigzag_positions(int64_t cp, int64_t r, int64_t chunk) {
  std::vector<int32_t> pos;
  for (const int64_t c : {r, 2 * cp - 1 - r})
    for (int64_t t = 0; t < chunk; ++t) pos.push_back(int32_t(c * chunk + t));
  return pos;
}

// Rows pos of every sequence of x [B, T, W] (W = H*D) -> [B, pos.size(), W].
std::vector<float> gather_tokens(const std::vector<float>& x, int64_t B, int64_t T, int64_t W,
                                 const std::vector<int32_t>& pos) {
  std::vector<float> r;
  r.reserve(size_t(B) * pos.size() * size_t(W));
  for (int64_t b = 0; b < B; ++b)
    for (const int32_t p : pos) {
      const auto first = x.begin() + (b * T + p) * W;
      r.insert(r.end(), first, first + W);
    }
  return r;
}

// The inverse: local [B, Tl, W] into rows pos of whole [B, T, W].
void scatter_tokens(std::vector<float>& whole, const std::vector<float>& local, int64_t B,
                    int64_t T, int64_t W, const std::vector<int32_t>& pos) {
  const int64_t Tl = int64_t(pos.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t l = 0; l < Tl; ++l)
      std::copy_n(local.begin() + (b * Tl + l) * W, W, whole.begin() + (b * T + pos[size_t(l)]) * W);
}

// lse [B, H, Tl] of a rank into the whole's [B, H, T].
void scatter_lse(std::vector<float>& whole, const std::vector<float>& local, int64_t B, int64_t H,
                 int64_t T, const std::vector<int32_t>& pos) {
  const int64_t Tl = int64_t(pos.size());
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t l = 0; l < Tl; ++l) whole[size_t(bh * T + pos[size_t(l)])] = local[size_t(bh * Tl + l)];
}

Tensor view(std::vector<float>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), DType::F32, dims);
}
Tensor view_i32(std::vector<int32_t>& v) {
  return Tensor(v.data(), DType::I32, {int64_t(v.size())});
}

struct RingCase {
  int64_t cp, B, Hq, Hkv, D, chunk;
  int64_t window = 0;  // sliding window (0: none); the reference is the whole sequence's with it
};

void run_ring(const RingCase& c) {
  const int64_t cp = c.cp, B = c.B, Hq = c.Hq, Hkv = c.Hkv, D = c.D, chunk = c.chunk;
  const int64_t T = 2 * cp * chunk, Tl = 2 * chunk, WQ = Hq * D, WK = Hkv * D;
  char tag[160];
  std::snprintf(tag, sizeof tag, "cp=%lld B=%lld Hq=%lld Hkv=%lld D=%lld chunk=%lld T=%lld%s",
                (long long)cp, (long long)B, (long long)Hq, (long long)Hkv, (long long)D,
                (long long)chunk, (long long)T,
                c.window > 0 ? (" W=" + std::to_string(c.window)).c_str() : "");
  const uint64_t seed = uint64_t(cp * 1000 + Hq * 100 + Hkv * 10 + chunk + c.window * 7);

  // The whole sequence and its reference attention.
  std::vector<float> q(size_t(B * T * WQ)), k(size_t(B * T * WK)), v(size_t(B * T * WK)),
      dout(size_t(B * T * WQ));
  fill_normal(q, seed + 1);
  fill_normal(k, seed + 2);
  fill_normal(v, seed + 3);
  fill_normal(dout, seed + 4);
  std::vector<float> ref_out(q.size()), ref_lse(size_t(B * Hq * T)), ref_dq(q.size()),
      ref_dk(k.size()), ref_dv(v.size());
  ops::attention_forward(view(ref_out, {B, T, Hq, D}), view(ref_lse, {B, Hq, T}),
                         view(q, {B, T, Hq, D}), view(k, {B, T, Hkv, D}), view(v, {B, T, Hkv, D}),
                         true, c.window, Tensor{});
  ops::attention_backward(view(ref_dq, {B, T, Hq, D}), view(ref_dk, {B, T, Hkv, D}),
                          view(ref_dv, {B, T, Hkv, D}), view(dout, {B, T, Hq, D}),
                          view(q, {B, T, Hq, D}), view(k, {B, T, Hkv, D}), view(v, {B, T, Hkv, D}),
                          view(ref_out, {B, T, Hq, D}), view(ref_lse, {B, Hq, T}), true, c.window, Tensor{});

  // Every virtual rank's local pieces.
  struct Rank {
    std::vector<int32_t> pos;
    std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
  };
  std::vector<Rank> ranks(static_cast<size_t>(cp));
  for (int64_t r = 0; r < cp; ++r) {
    Rank& rk = ranks[size_t(r)];
    rk.pos = zigzag_positions(cp, r, chunk);
    rk.q = gather_tokens(q, B, T, WQ, rk.pos);
    rk.k = gather_tokens(k, B, T, WK, rk.pos);
    rk.v = gather_tokens(v, B, T, WK, rk.pos);
    rk.dout = gather_tokens(dout, B, T, WQ, rk.pos);
    rk.out.assign(rk.q.size(), 0.f);
    rk.lse.assign(size_t(B * Hq * Tl), -kInf);
    rk.dq.assign(rk.q.size(), 0.f);
    rk.dk.assign(rk.k.size(), 0.f);
    rk.dv.assign(rk.v.size(), 0.f);
  }

  // Forward ring: step s, rank r holds the block of rank (r - s) mod cp.
  std::vector<float> part_out(size_t(B * Tl * WQ)), part_lse(size_t(B * Hq * Tl));
  int64_t empty_rows = 0, skipped = 0;
  for (int64_t s = 0; s < cp; ++s)
    for (int64_t r = 0; r < cp; ++r) {
      Rank& rk = ranks[size_t(r)];
      Rank& src = ranks[size_t((r - s + cp) % cp)];
      std::fill(part_out.begin(), part_out.end(), kNaN);  // the op must write every element
      std::fill(part_lse.begin(), part_lse.end(), kNaN);
      ops::attention_forward_pos(view(part_out, {B, Tl, Hq, D}), view(part_lse, {B, Hq, Tl}),
                                 view(rk.q, {B, Tl, Hq, D}), view(src.k, {B, Tl, Hkv, D}),
                                 view(src.v, {B, Tl, Hkv, D}), view_i32(rk.pos),
                                 view_i32(src.pos), c.window, Tensor{});
      REQUIRE(!any_nan(part_out));
      REQUIRE(!any_nan(part_lse));
      const auto empty = std::count(part_lse.begin(), part_lse.end(), -kInf);
      empty_rows += empty;
      // The ring skips a block exactly when no query of the rank sees any of
      // its keys (model/context_parallel.h).
      const bool needed = ring_block_needed(T, int(cp), int(r), int((r - s + cp) % cp), c.window);
      CHECK(needed == (empty < int64_t(part_lse.size())));
      skipped += needed ? 0 : 1;
      ops::attention_merge(view(rk.out, {B, Tl, Hq, D}), view(rk.lse, {B, Hq, Tl}),
                           view(part_out, {B, Tl, Hq, D}), view(part_lse, {B, Hq, Tl}));
    }
  std::vector<float> ring_out(q.size(), kNaN), ring_lse(ref_lse.size(), kNaN);
  for (Rank& rk : ranks) {
    scatter_tokens(ring_out, rk.out, B, T, WQ, rk.pos);
    scatter_lse(ring_lse, rk.lse, B, Hq, T, rk.pos);
  }
  const double e_out = rel_err(ring_out, ref_out), e_lse = rel_err(ring_lse, ref_lse);
  std::printf("[ring fwd]  %-52s out max_rel_err=%.3e (per element %.1e) lse max_rel_err=%.3e "
              "(per element %.1e); %lld of %lld partial rows saw no key, %lld of %lld blocks skippable\n",
              tag, e_out, elem_err(ring_out, ref_out), e_lse, elem_err(ring_lse, ref_lse),
              (long long)empty_rows, (long long)(cp * cp * B * Hq * Tl), (long long)skipped,
              (long long)(cp * cp));
  CHECK(e_out <= kRingTol);
  CHECK(e_lse <= kRingTol);
  // With cp > 1 some blocks are invisible to whole chunks of queries.
  if (cp > 1) CHECK(empty_rows > 0);

  // Backward ring, with each rank's final out and lse.
  for (int64_t s = 0; s < cp; ++s)
    for (int64_t r = 0; r < cp; ++r) {
      Rank& rk = ranks[size_t(r)];
      Rank& src = ranks[size_t((r - s + cp) % cp)];
      ops::attention_backward_pos(
          view(rk.dq, {B, Tl, Hq, D}), view(src.dk, {B, Tl, Hkv, D}), view(src.dv, {B, Tl, Hkv, D}),
          view(rk.dout, {B, Tl, Hq, D}), view(rk.q, {B, Tl, Hq, D}), view(src.k, {B, Tl, Hkv, D}),
          view(src.v, {B, Tl, Hkv, D}), view(rk.out, {B, Tl, Hq, D}), view(rk.lse, {B, Hq, Tl}),
          view_i32(rk.pos), view_i32(src.pos), c.window, Tensor{});
    }
  std::vector<float> ring_dq(q.size(), kNaN), ring_dk(k.size(), kNaN), ring_dv(v.size(), kNaN);
  for (Rank& rk : ranks) {
    scatter_tokens(ring_dq, rk.dq, B, T, WQ, rk.pos);
    scatter_tokens(ring_dk, rk.dk, B, T, WK, rk.pos);
    scatter_tokens(ring_dv, rk.dv, B, T, WK, rk.pos);
  }
  const double e_dq = rel_err(ring_dq, ref_dq), e_dk = rel_err(ring_dk, ref_dk),
               e_dv = rel_err(ring_dv, ref_dv);
  std::printf("[ring bwd]  %-52s dq max_rel_err=%.3e dk max_rel_err=%.3e dv max_rel_err=%.3e "
              "(per element %.1e %.1e %.1e)\n",
              tag, e_dq, e_dk, e_dv, elem_err(ring_dq, ref_dq), elem_err(ring_dk, ref_dk),
              elem_err(ring_dv, ref_dv));
  CHECK(e_dq <= kRingTol);
  CHECK(e_dk <= kRingTol);
  CHECK(e_dv <= kRingTol);
}

// float64 attention at positions, from the definition; lse -inf and out 0
// for a row that sees nothing.
void attention_pos_twin(std::vector<double>& out, std::vector<double>& lse,
                        const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                        int64_t Hkv, int64_t D, const std::vector<int32_t>& qpos,
                        const std::vector<int32_t>& kpos) {
  out.assign(size_t(B * Tq * Hq * D), 0.0);
  lse.assign(size_t(B * Hq * Tq), -double(kInf));
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s(static_cast<size_t>(Tk));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t i = 0; i < Tq; ++i) {
        double mx = -double(kInf);
        for (int64_t j = 0; j < Tk; ++j) {
          if (kpos[size_t(j)] > qpos[size_t(i)]) continue;
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += double(q[size_t(((b * Tq + i) * Hq + h) * D + c)]) *
                 k[size_t(((b * Tk + j) * Hkv + g) * D + c)];
          s[size_t(j)] = d * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        if (mx == -double(kInf)) continue;
        double z = 0;
        for (int64_t j = 0; j < Tk; ++j)
          if (kpos[size_t(j)] <= qpos[size_t(i)]) z += std::exp(s[size_t(j)] - mx);
        lse[size_t((b * Hq + h) * Tq + i)] = mx + std::log(z);
        for (int64_t j = 0; j < Tk; ++j) {
          if (kpos[size_t(j)] > qpos[size_t(i)]) continue;
          const double p = std::exp(s[size_t(j)] - mx) / z;
          for (int64_t c = 0; c < D; ++c)
            out[size_t(((b * Tq + i) * Hq + h) * D + c)] +=
                p * v[size_t(((b * Tk + j) * Hkv + g) * D + c)];
        }
      }
    }
}

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("ring attention over zigzag chunks equals causal attention of the whole sequence",
          "[ops][cp]") {
  for (const int64_t cp : {1, 2, 3, 4})
    for (const auto& [Hq, Hkv] : {std::pair<int64_t, int64_t>{4, 2}, {2, 2}})
      for (const int64_t chunk : {5, 7}) run_ring(RingCase{cp, 2, Hq, Hkv, 16, chunk});
}

TEST_CASE("ring attention with a sliding window equals windowed attention of the whole sequence",
          "[ops][cp][window]") {
  // Windows shorter than a chunk (blocks far apart are skipped whole), about
  // a chunk, across several chunks, and the whole sequence; GQA and not.
  for (const int64_t cp : {2, 4})
    for (const int64_t window : {1, 3, 5, 12, 40}) {
      run_ring(RingCase{cp, 2, 4, 2, 16, 5, window});
      run_ring(RingCase{cp, 1, 2, 2, 16, 7, window});
    }
  run_ring(RingCase{2, 1, 4, 2, 16, 37, 50});  // local sequences of two CPU blocks
}

TEST_CASE("ring_block_needed: the zigzag chunk pairs a window reaches", "[cp][window]") {
  // cp 2, T 16: rank 0 holds positions 0-3 and 12-15, rank 1 4-7 and 8-11.
  CHECK(ring_block_needed(16, 2, 0, 0, 1));
  CHECK(ring_block_needed(16, 2, 0, 1, 1));   // 12 sees 11
  CHECK(ring_block_needed(16, 2, 1, 0, 1));   // 4 sees 3
  // cp 4, T 32, chunks of 4: rank 0 holds chunks 0 and 7 (0-3, 28-31), rank 2
  // chunks 2 and 5 (8-11, 20-23): the closest pair is 28 - 23 = 5.
  CHECK_FALSE(ring_block_needed(32, 4, 0, 2, 4));
  CHECK(ring_block_needed(32, 4, 0, 2, 5));
  CHECK(ring_block_needed(32, 4, 0, 2, 0));   // no window: every earlier key
  CHECK_FALSE(ring_block_needed(32, 4, 2, 0, 4));  // 8 - 3 = 5, 20 - 3 = 17: too far
  CHECK(ring_block_needed(32, 4, 2, 0, 0));
}

TEST_CASE("ring attention with local sequences longer than one CPU block (64 query rows)",
          "[ops][cp]") {
  // chunk 37: each rank holds 74 tokens, a ragged second block of 10 rows.
  run_ring(RingCase{2, 2, 4, 2, 16, 37});
  run_ring(RingCase{3, 1, 2, 1, 16, 37});
}

TEST_CASE("attention_forward_pos with identity positions is attention_forward(causal), bit for bit",
          "[ops][cp]") {
  for (const int64_t T : {13, 97, 160}) {  // 160: threaded (B*Hq*T^2*D above the threshold)
    const int64_t B = 2, Hq = 4, Hkv = 2, D = 16;
    const uint64_t seed = 500 + uint64_t(T);
    Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), dout({B, T, Hq, D});
    fill_normal(q.f, seed);
    fill_normal(k.f, seed + 1);
    fill_normal(v.f, seed + 2);
    fill_normal(dout.f, seed + 3);
    Owned pos({T}, DType::I32);
    std::iota(pos.i.begin(), pos.i.end(), 0);

    Owned out({B, T, Hq, D}), lse({B, Hq, T}), out_p({B, T, Hq, D}), lse_p({B, Hq, T});
    ops::attention_forward(out, lse, q, k, v, true, 0, Tensor{});
    ops::attention_forward_pos(out_p, lse_p, q, k, v, pos, pos, 0, Tensor{});
    const size_t d_out = bit_differences(out_p.f, out.f), d_lse = bit_differences(lse_p.f, lse.f);
    const double e_out = rel_err(out_p.f, out.f), e_lse = rel_err(lse_p.f, lse.f);
    std::printf("[identity]  forward  T=%-4lld out: %zu of %zu differ (max_rel_err=%.3e), lse: %zu "
                "of %zu differ (max_rel_err=%.3e)\n",
                (long long)T, d_out, out.f.size(), e_out, d_lse, lse.f.size(), e_lse);
    CHECK(e_out <= 1e-6);
    CHECK(e_lse <= 1e-6);
    CHECK(d_out == 0);
    CHECK(d_lse == 0);

    // Backward into zeroed buffers (the op accumulates) vs the overwriting one.
    Owned dq({B, T, Hq, D}), dk({B, T, Hkv, D}), dv({B, T, Hkv, D});
    Owned dq_p({B, T, Hq, D}), dk_p({B, T, Hkv, D}), dv_p({B, T, Hkv, D});
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, true, 0, Tensor{});
    ops::attention_backward_pos(dq_p, dk_p, dv_p, dout, q, k, v, out, lse, pos, pos, 0, Tensor{});
    const size_t d_dq = bit_differences(dq_p.f, dq.f), d_dk = bit_differences(dk_p.f, dk.f),
                 d_dv = bit_differences(dv_p.f, dv.f);
    std::printf("[identity]  backward T=%-4lld dq/dk/dv: %zu/%zu/%zu elements differ "
                "(max_rel_err %.3e/%.3e/%.3e)\n",
                (long long)T, d_dq, d_dk, d_dv, rel_err(dq_p.f, dq.f), rel_err(dk_p.f, dk.f),
                rel_err(dv_p.f, dv.f));
    CHECK(d_dq == 0);
    CHECK(d_dk == 0);
    CHECK(d_dv == 0);

    // Accumulates: a second call adds the same again (up to rounding: each
    // block's share is added into a nonzero sum now).
    ops::attention_backward_pos(dq_p, dk_p, dv_p, dout, q, k, v, out, lse, pos, pos, 0, Tensor{});
    auto twice = [](const std::vector<float>& x) {
      std::vector<float> r(x.size());
      for (size_t i = 0; i < x.size(); ++i) r[i] = x[i] + x[i];
      return r;
    };
    const double e2 = std::max({rel_err(dq_p.f, twice(dq.f)), rel_err(dk_p.f, twice(dk.f)),
                                rel_err(dv_p.f, twice(dv.f))});
    std::printf("[identity]  backward T=%-4lld called twice = 2x once: max_rel_err=%.3e\n",
                (long long)T, e2);
    CHECK(e2 <= 1e-6);
  }
}

TEST_CASE("attention_forward_pos at scattered positions: float64 twin, masked rows, gradients",
          "[ops][cp]") {
  // Random positions: visible keys with holes, rows that see nothing, keys
  // that nobody sees, Tq != Tk.
  const int64_t B = 2, Tq = 11, Tk = 9, Hq = 4, Hkv = 2, D = 8;
  Owned q({B, Tq, Hq, D}), k({B, Tk, Hkv, D}), v({B, Tk, Hkv, D}), R({B, Tq, Hq, D});
  fill_normal(q.f, 601);
  fill_normal(k.f, 602);
  fill_normal(v.f, 603);
  fill_normal(R.f, 604);
  Owned qpos({Tq}, DType::I32), kpos({Tk}, DType::I32);
  qpos.i = {3, 40, 0, 17, 2, 25, 9, 1, 33, 12, 5};
  kpos.i = {10, 4, 30, 2, 22, 8, 35, 15, 50};  // 50: after every query
  std::vector<double> twin_out, twin_lse;
  auto twin = [&] {
    attention_pos_twin(twin_out, twin_lse, q.f, k.f, v.f, B, Tq, Tk, Hq, Hkv, D, qpos.i, kpos.i);
    return twin_out;
  };
  twin();

  Owned out({B, Tq, Hq, D}), lse({B, Hq, Tq});
  out.f.assign(out.f.size(), kNaN);
  lse.f.assign(lse.f.size(), kNaN);
  ops::attention_forward_pos(out, lse, q, k, v, qpos, kpos, 0, Tensor{});
  const double e_out = rel_err(out.f, to_float(twin_out)), e_lse = rel_err(lse.f, to_float(twin_lse));
  const auto masked = std::count(lse.f.begin(), lse.f.end(), -kInf);
  std::printf("[scattered] forward  out max_rel_err=%.3e lse max_rel_err=%.3e (per element %.1e, "
              "%.1e) against float64; %lld rows see no key\n",
              e_out, e_lse, elem_err(out.f, to_float(twin_out)), elem_err(lse.f, to_float(twin_lse)),
              (long long)masked);
  CHECK(e_out <= 1e-5);
  CHECK(e_lse <= 1e-5);
  // The queries at positions 0 and 1 (rows 2 and 7) see no key (the
  // smallest key position is 2): lse -inf, out exactly 0.
  CHECK(masked == B * Hq * 2);
  for (int64_t b = 0; b < B; ++b)
    for (const int64_t i : {2, 7})
      for (int64_t c = 0; c < Hq * D; ++c) CHECK(out.f[size_t((b * Tq + i) * Hq * D + c)] == 0.f);

  // Gradients of sum(out * R) by central differences of the float64 twin.
  Owned dq({B, Tq, Hq, D}), dk({B, Tk, Hkv, D}), dv({B, Tk, Hkv, D});
  ops::attention_backward_pos(dq, dk, dv, R, q, k, v, out, lse, qpos, kpos, 0, Tensor{});
  auto loss = [&] {
    const std::vector<double> o = twin();
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * double(R.f[i]);
    return s;
  };
  constexpr double kH = 1.0 / 1024;
  CHECK(test::grad_check("attention_backward_pos dq (scattered)", q.f, dq.f, loss, kH).max_rel_err <
        1e-4);
  CHECK(test::grad_check("attention_backward_pos dk (scattered)", k.f, dk.f, loss, kH).max_rel_err <
        1e-4);
  CHECK(test::grad_check("attention_backward_pos dv (scattered)", v.f, dv.f, loss, kH).max_rel_err <
        1e-4);
  // Rows that see nothing get dq = 0, the key nobody sees dk = dv = 0.
  for (int64_t b = 0; b < B; ++b) {
    for (const int64_t i : {2, 7})
      for (int64_t c = 0; c < Hq * D; ++c) CHECK(dq.f[size_t((b * Tq + i) * Hq * D + c)] == 0.f);
    for (int64_t c = 0; c < Hkv * D; ++c) {
      CHECK(dk.f[size_t((b * Tk + 8) * Hkv * D + c)] == 0.f);
      CHECK(dv.f[size_t((b * Tk + 8) * Hkv * D + c)] == 0.f);
    }
  }
}

TEST_CASE("attention_forward_pos: a block nobody sees, and no keys at all", "[ops][cp]") {
  const int64_t B = 1, T = 6, Hq = 2, Hkv = 1, D = 4;
  Owned q({B, T, Hq, D}), k({B, T, Hkv, D}), v({B, T, Hkv, D}), out({B, T, Hq, D}), lse({B, Hq, T});
  fill_normal(q.f, 701);
  fill_normal(k.f, 702);
  fill_normal(v.f, 703);
  v.f[0] = kInf;  // never seen: must not leak into out as 0 * inf
  Owned qpos({T}, DType::I32), kpos({T}, DType::I32);
  std::iota(qpos.i.begin(), qpos.i.end(), 0);
  std::iota(kpos.i.begin(), kpos.i.end(), 100);  // every key after every query
  out.f.assign(out.f.size(), kNaN);
  ops::attention_forward_pos(out, lse, q, k, v, qpos, kpos, 0, Tensor{});
  CHECK(std::all_of(out.f.begin(), out.f.end(), [](float x) { return x == 0.f; }));
  CHECK(std::all_of(lse.f.begin(), lse.f.end(), [](float x) { return x == -kInf; }));

  // Backward with lse = -inf everywhere adds nothing.
  Owned dq({B, T, Hq, D}), dk({B, T, Hkv, D}), dv({B, T, Hkv, D});
  ops::attention_backward_pos(dq, dk, dv, q, q, k, v, out, lse, qpos, kpos, 0, Tensor{});
  CHECK(std::all_of(dq.f.begin(), dq.f.end(), [](float x) { return x == 0.f; }));
  CHECK(std::all_of(dk.f.begin(), dk.f.end(), [](float x) { return x == 0.f; }));
  CHECK(std::all_of(dv.f.begin(), dv.f.end(), [](float x) { return x == 0.f; }));

  // Tk = 0: every row sees nothing.
  Owned k0({B, 0, Hkv, D}), v0({B, 0, Hkv, D}), kpos0({0}, DType::I32);
  out.f.assign(out.f.size(), kNaN);
  lse.f.assign(lse.f.size(), kNaN);
  ops::attention_forward_pos(out, lse, q, k0, v0, qpos, kpos0, 0, Tensor{});
  CHECK(std::all_of(out.f.begin(), out.f.end(), [](float x) { return x == 0.f; }));
  CHECK(std::all_of(lse.f.begin(), lse.f.end(), [](float x) { return x == -kInf; }));
}

TEST_CASE("attention_merge: logaddexp weights, -inf rows, NaN", "[ops][cp]") {
  const int64_t B = 1, T = 5, H = 2, D = 3;
  Owned out({B, T, H, D}), lse({B, H, T}), part({B, T, H, D}), plse({B, H, T});
  fill_normal(out.f, 801);
  fill_normal(part.f, 802);
  fill_normal(lse.f, 803);
  fill_normal(plse.f, 804);
  // Per (h, t): t = 0 both -inf, t = 1 running -inf (first merge), t = 2 part
  // -inf, t = 3 NaN part, t = 4 both finite.
  for (int64_t h = 0; h < H; ++h) {
    lse.f[size_t(h * T + 0)] = plse.f[size_t(h * T + 0)] = -kInf;
    lse.f[size_t(h * T + 1)] = -kInf;
    plse.f[size_t(h * T + 2)] = -kInf;
    plse.f[size_t(h * T + 3)] = kNaN;
  }
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < D; ++d) {
      out.f[size_t((0 * H + h) * D + d)] = 0.f;  // the contract: an -inf row holds 0
      out.f[size_t((1 * H + h) * D + d)] = 0.f;
    }
  const std::vector<float> o0 = out.f, l0 = lse.f;
  ops::attention_merge(out, lse, part, plse);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const size_t li = size_t(h * T + t);
      const double a = l0[li], b = plse.f[li];
      for (int64_t d = 0; d < D; ++d) {
        const size_t oi = size_t((t * H + h) * D + d);
        const float got = out.f[oi];
        if (t == 0) {
          CHECK(got == 0.f);
        } else if (t == 1) {
          CHECK(got == part.f[oi]);  // copied exactly
        } else if (t == 2) {
          CHECK(got == o0[oi]);
        } else if (t == 3) {
          CHECK(std::isnan(got));
        } else {
          const double m = std::max(a, b), l = m + std::log(std::exp(a - m) + std::exp(b - m));
          const double want = o0[oi] * std::exp(a - l) + part.f[oi] * std::exp(b - l);
          worst = std::max(worst, std::fabs(got - want) / std::max(std::fabs(want), 1e-2));
          CHECK(std::fabs(lse.f[li] - l) <= 1e-6 * std::fabs(l) + 1e-7);
        }
      }
      if (t == 0) CHECK(lse.f[li] == -kInf);
      if (t == 1) CHECK(lse.f[li] == plse.f[li]);
      if (t == 2) CHECK(lse.f[li] == l0[li]);
      if (t == 3) CHECK(std::isnan(lse.f[li]));
    }
  std::printf("[merge]     finite rows max_rel_err=%.3e\n", worst);
  CHECK(worst <= 1e-6);

  Owned bad_lse({B, H, T + 1});
  test::require_rejected([&] { ops::attention_merge(out, bad_lse, part, plse); },
                         {"attention_merge: ", "lse [1, 2, 6] vs out [1, 5, 2, 3]: expected [1, 2, 5]"});
}

TEST_CASE("rope_forward_pos / rope_backward_pos: rope at an offset and the zigzag chunks, bit for bit",
          "[ops][cp]") {
  const int64_t B = 2, H = 3, D = 16;
  for (const float theta : {1e4f, 5e5f})
    for (const int64_t offset : {int64_t(0), int64_t(7), int64_t(3000)}) {
      const int64_t T = 9;
      Owned x({B, T, H, D}), a({B, T, H, D}), b({B, T, H, D});
      fill_normal(x.f, 900 + uint64_t(offset));
      Owned pos({T}, DType::I32);
      std::iota(pos.i.begin(), pos.i.end(), int32_t(offset));
      ops::rope_forward(a, x, theta, offset);
      ops::rope_forward_pos(b, x, theta, pos);
      const size_t fwd = bit_differences(b.f, a.f);
      ops::rope_backward(a, x, theta, offset);
      ops::rope_backward_pos(b, x, theta, pos);
      const size_t bwd = bit_differences(b.f, a.f);
      // In place.
      Owned inplace({B, T, H, D});
      inplace.f = x.f;
      ops::rope_forward_pos(inplace, inplace, theta, pos);
      ops::rope_forward(a, x, theta, offset);
      const size_t in_place = bit_differences(inplace.f, a.f);
      std::printf("[rope pos]  theta=%g offset=%lld: forward %zu, backward %zu, in place %zu of "
                  "%zu elements differ from rope at the offset\n",
                  double(theta), (long long)offset, fwd, bwd, in_place, a.f.size());
      CHECK(fwd == 0);
      CHECK(bwd == 0);
      CHECK(in_place == 0);
    }

  // A zigzag rank's tokens rotate as those tokens of the whole sequence.
  const int64_t cp = 3, chunk = 7, T = 2 * cp * chunk;
  Owned whole({B, T, H, D}), whole_out({B, T, H, D});
  fill_normal(whole.f, 950);
  ops::rope_forward(whole_out, whole, 1e4f, 0);
  for (int64_t r = 0; r < cp; ++r) {
    std::vector<int32_t> pos = zigzag_positions(cp, r, chunk);
    std::vector<float> local = gather_tokens(whole.f, B, T, H * D, pos), rotated(local.size());
    ops::rope_forward_pos(view(rotated, {B, 2 * chunk, H, D}), view(local, {B, 2 * chunk, H, D}),
                          1e4f, view_i32(pos));
    const size_t diff = bit_differences(rotated, gather_tokens(whole_out.f, B, T, H * D, pos));
    std::printf("[rope pos]  zigzag cp=%lld rank %lld: %zu of %zu elements differ from the whole\n",
                (long long)cp, (long long)r, diff, rotated.size());
    CHECK(diff == 0);
  }

  Owned x({1, 4, 1, 8}), y({1, 4, 1, 8}), short_pos({3}, DType::I32), f_pos({4});
  test::require_rejected([&] { ops::rope_forward_pos(y, x, 1e4f, short_pos); },
                         {"rope_forward_pos: ", "pos [3] vs inp [1, 4, 1, 8]: expected [4]"});
  test::require_rejected([&] { ops::rope_backward_pos(y, x, 1e4f, f_pos); },
                         {"rope_backward_pos: ", "pos [4] is F32, expected I32"});
}

TEST_CASE("attention_forward_pos / attention_backward_pos shape errors", "[ops][cp]") {
  Owned q({1, 5, 4, 8}), k({1, 3, 2, 8}), v({1, 3, 2, 8}), out({1, 5, 4, 8}), lse({1, 4, 5});
  Owned qpos({5}, DType::I32), kpos({3}, DType::I32), kpos_bad({5}, DType::I32);
  test::require_rejected(
      [&] { ops::attention_forward_pos(out, lse, q, k, v, qpos, kpos_bad, 0, Tensor{}); },
      {"attention_forward_pos: ", "k_pos [5] vs k [1, 3, 2, 8]: expected [3]"});
  Owned lse_bad({1, 4, 3});
  test::require_rejected([&] { ops::attention_forward_pos(out, lse_bad, q, k, v, qpos, kpos, 0, Tensor{}); },
                         {"attention_forward_pos: ", "lse [1, 4, 3] vs q [1, 5, 4, 8]: expected [1, 4, 5]"});
  Owned dk_bad({1, 5, 2, 8}), dq({1, 5, 4, 8}), dv({1, 3, 2, 8});
  test::require_rejected(
      [&] { ops::attention_backward_pos(dq, dk_bad, dv, out, q, k, v, out, lse, qpos, kpos, 0, Tensor{}); },
      {"attention_backward_pos: ", "dk [1, 5, 2, 8] vs k [1, 3, 2, 8]"});
}
