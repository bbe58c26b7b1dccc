// The vocabulary-parallel ops (tensor parallelism over the vocabulary) on the
// CPU, against the whole-vocabulary ops they split: a table or a row of
// logits cut over P ranks the way the sharding plan does (ceil(V/P) rows or
// columns per rank, the last part padded, possibly with nothing real in it),
// and each rank's result put back together.
//
// Embedding: every id is held by exactly one rank and the others contribute
// zero, so the sum of the ranks' lookups and the union of their backward
// rows must equal the whole table's bit for bit. Cross-entropy: the pair
// (partial stats, combine) must equal the fused op to within fp32 rounding
// of the stored sum s; the error is printed.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

using namespace trainer;
using test::fill_ints;
using test::fill_normal;
using test::Owned;
using test::require_rejected;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// One rank's part of a vocabulary of V ids split over P ranks.
struct Part {
  int64_t offset, size, valid;  // first id, rows/columns held (padded), real ones
};

Part part_of(int64_t V, int64_t P, int64_t p) {
  const int64_t size = (V + P - 1) / P, offset = p * size;
  return {offset, size, std::clamp<int64_t>(V - offset, 0, size)};
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// max |got - ref| / max(|ref|, floor) over the elements; NaN counts as infinite.
double max_rel(const std::vector<float>& got, const std::vector<float>& ref, double floor) {
  REQUIRE(got.size() == ref.size());
  double m = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e =
        std::fabs(double(got[i]) - double(ref[i])) / std::max(std::fabs(double(ref[i])), floor);
    m = std::max(m, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  }
  return m;
}

}  // namespace

// ---- embedding ------------------------------------------------------------------

TEST_CASE("vocab-parallel embedding: ranks' forward sums and backward rows equal the whole table",
          "[ops][vocab_parallel]") {
  const int64_t V = 11, C = 6;
  // Every id at least once, several repeated (the backward sums them in
  // token order), the first and last id included.
  std::vector<int32_t> id_list = {3, 0, 10, 3, 7, 1, 2, 4, 5, 6, 8, 9, 3, 10, 0, 7, 3};
  const int64_t N = int64_t(id_list.size());
  Owned table({V, C}), ids({N}, DType::I32);
  fill_normal(table.f, 200);
  ids.i = id_list;

  Owned whole({N, C}), base({N, C}), whole_acc({N, C}), dout({N, C}), dwhole({V, C});
  fill_normal(base.f, 201);
  base.f[0] = -0.f;  // token 0 (id 3): stays -0 on the ranks that do not hold id 3
  fill_normal(dout.f, 202);
  fill_normal(dwhole.f, 203);
  const std::vector<float> dtable0 = dwhole.f;
  cpu::embedding_forward(whole, ids, table, false, 0, V);
  whole_acc.f = base.f;
  cpu::embedding_forward(whole_acc, ids, table, true, 0, V);
  cpu::embedding_backward(dwhole, ids, dout, 0, V);

  for (int64_t P : {2, 3, 4, 5}) {  // P = 5: 3 rows a rank, the last rank holds padding only
    INFO("P = " << P);
    Owned sum({N, C}), acc({N, C});
    acc.f = base.f;
    int64_t padding_only = 0;
    for (int64_t p = 0; p < P; ++p) {
      const Part pt = part_of(V, P, p);
      INFO("rank " << p << " rows [" << pt.offset << ", " << pt.offset + pt.size << "), "
                   << pt.valid << " real");
      padding_only += pt.valid == 0;
      // Padding rows are NaN: a lookup that reached one would show.
      Owned tab({pt.size, C}), out({N, C}), one_acc({N, C}), dtab({pt.size, C});
      tab.f.assign(tab.f.size(), kNaN);
      dtab.f.assign(dtab.f.size(), 1234.5f);
      for (int64_t r = 0; r < pt.valid; ++r)
        for (int64_t c = 0; c < C; ++c) {
          tab.f[size_t(r * C + c)] = table.f[size_t((pt.offset + r) * C + c)];
          dtab.f[size_t(r * C + c)] = dtable0[size_t((pt.offset + r) * C + c)];
        }
      out.f.assign(out.f.size(), kNaN);  // every row must be written
      ops::embedding_forward(out, ids, tab, false, pt.offset, V);
      one_acc.f = base.f;
      ops::embedding_forward(one_acc, ids, tab, true, pt.offset, V);
      ops::embedding_forward(acc, ids, tab, true, pt.offset, V);
      for (int64_t n = 0; n < N; ++n) {
        const bool held = id_list[size_t(n)] >= pt.offset && id_list[size_t(n)] < pt.offset + pt.valid;
        const float* o = &out.f[size_t(n * C)];
        const float* a = &one_acc.f[size_t(n * C)];
        if (held) {
          CHECK(same_bits(o, &whole.f[size_t(n * C)], size_t(C)));
          CHECK(same_bits(a, &whole_acc.f[size_t(n * C)], size_t(C)));
        } else {
          CHECK(std::all_of(o, o + C, [](float v) { return v == 0.f && !std::signbit(v); }));
          CHECK(same_bits(a, &base.f[size_t(n * C)], size_t(C)));  // -0 stays -0
        }
        for (int64_t c = 0; c < C; ++c) sum.f[size_t(n * C + c)] += o[c];
      }

      ops::embedding_backward(dtab, ids, dout, pt.offset, V);
      CHECK(same_bits(dtab.f.data(), &dwhole.f[size_t(pt.offset * C)], size_t(pt.valid * C)));
      for (int64_t i = pt.valid * C; i < pt.size * C; ++i)
        CHECK(dtab.f[size_t(i)] == 1234.5f);  // padding rows untouched
    }
    CHECK(same_bits(sum.f.data(), whole.f.data(), sum.f.size()));
    CHECK(same_bits(acc.f.data(), whole_acc.f.data(), acc.f.size()));
    std::printf("[vocab_parallel] embedding V=%lld P=%lld (%lld padding-only ranks): forward sum, "
                "accumulate and backward rows bitwise equal to the whole table\n",
                (long long)V, (long long)P, (long long)padding_only);
    if (P == 5) CHECK(padding_only == 1);
  }
}

TEST_CASE("vocab-parallel embedding: bad ids and arguments are refused before any write",
          "[ops][vocab_parallel]") {
  const int64_t V = 11, C = 4, N = 5;
  const Part pt = part_of(V, 3, 2);  // rows [8, 12), ids 8..10 real
  Owned tab({pt.size, C}), ids({N}, DType::I32), out({N, C}), dtab({pt.size, C}), dout({N, C});
  fill_normal(tab.f, 210);
  fill_normal(dout.f, 211);
  ids.i = {8, 1, 10, 11, 9};  // 11 would be a padding row of this rank, but is no id
  out.f.assign(out.f.size(), 7.f);
  const std::vector<float> out0 = out.f, dtab0 = dtab.f;
  REQUIRE_THROWS_WITH(ops::embedding_forward(out, ids, tab, false, pt.offset, V),
                      "embedding_forward: id 11 at position 3 is outside the vocabulary [0, 11)");
  REQUIRE_THROWS_WITH(ops::embedding_backward(dtab, ids, dout, pt.offset, V),
                      "embedding_backward: id 11 at position 3 is outside the vocabulary [0, 11)");
  ids.i[3] = -2;
  REQUIRE_THROWS_WITH(ops::embedding_forward(out, ids, tab, true, pt.offset, V),
                      "embedding_forward: id -2 at position 3 is outside the vocabulary [0, 11)");
  CHECK(out.f == out0);
  CHECK(dtab.f == dtab0);

  ids.i[3] = 0;
  require_rejected([&] { ops::embedding_forward(out, ids, tab, false, -1, V); },
                   {"embedding_forward: ", "row_offset -1 must be >= 0"});
  require_rejected([&] { ops::embedding_backward(dtab, ids, dout, -3, V); },
                   {"embedding_backward: ", "row_offset -3 must be >= 0"});
  require_rejected([&] { ops::embedding_forward(out, ids, tab, false, 0, 0); },
                   {"embedding_forward: ", "vocab_size 0 must be >= 1"});
  CHECK(out.f == out0);
}

// ---- cross-entropy ----------------------------------------------------------------

namespace {

// One rank's logits [N, size]: its columns of the whole [N, V] logits, the
// padding columns NaN (they must never be read).
std::vector<float> local_logits(const std::vector<float>& whole, int64_t N, int64_t V, const Part& pt) {
  std::vector<float> l(size_t(N * pt.size), kNaN);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < pt.valid; ++j) l[size_t(n * pt.size + j)] = whole[size_t(n * V + pt.offset + j)];
  return l;
}

}  // namespace

TEST_CASE("vocab-parallel cross-entropy: stats + combine over P ranks equal the fused op",
          "[ops][vocab_parallel]") {
  const int64_t N = 7, V = 13;
  Owned logits({N, V}), targets({N}, DType::I32);
  fill_normal(logits.f, 220, 3.f);
  fill_ints(targets.i, 221, 0, int(V));
  targets.i[0] = 0;
  targets.i[1] = int32_t(V - 1);  // in the last, padded part
  targets.i[2] = -1;              // ignored
  targets.i[4] = -100;            // ignored (PyTorch's ignore_index)
  // Tolerance: s is stored in fp32 (relative rounding 2^-24 per rank), which
  // moves lse by ~1e-7 at most; losses are judged against max(|loss|, 1)
  // (a loss is a difference of two O(1..10) numbers, its error absolute),
  // gradients against max(|g|, 1e-2 * grad_scale).
  constexpr double kTol = 1e-6;

  for (float grad_scale : {1.f, 0.5f}) {
    Owned ref_loss({N}), ref_dl({N, V});
    cpu::cross_entropy_forward_backward(ref_loss, ref_dl, logits, targets, grad_scale);
    for (int64_t P : {1, 2, 3, 4, 5, 6}) {  // P = 5: ragged parts; P = 6: a padding-only rank
      INFO("P = " << P << " grad_scale = " << grad_scale);
      std::vector<std::vector<float>> locals;
      Owned all({P, N, 3});
      for (int64_t p = 0; p < P; ++p) {
        const Part pt = part_of(V, P, p);
        locals.push_back(local_logits(logits.f, N, V, pt));
        Owned stats({N, 3});
        stats.f.assign(stats.f.size(), kNaN);
        ops::cross_entropy_partial_stats(stats, Tensor(locals.back().data(), DType::F32, {N, pt.size}),
                                         targets, pt.offset, pt.valid, V);
        std::copy(stats.f.begin(), stats.f.end(), all.f.begin() + p * N * 3);
      }

      std::vector<float> cat_dl(size_t(N * V), kNaN), first_loss;
      int64_t padding_only = 0;
      for (int64_t p = 0; p < P; ++p) {
        const Part pt = part_of(V, P, p);
        padding_only += pt.valid == 0;
        INFO("rank " << p << " columns [" << pt.offset << ", " << pt.offset + pt.size << "), "
                     << pt.valid << " real");
        const Tensor lt(locals[size_t(p)].data(), DType::F32, {N, pt.size});
        Owned loss({N}), dl({N, pt.size});
        loss.f.assign(loss.f.size(), kNaN);
        dl.f.assign(dl.f.size(), kNaN);
        ops::cross_entropy_vocab_parallel(loss, dl, lt, targets, all, pt.offset, pt.valid, grad_scale);
        // Every rank computes the same losses from the same stats.
        if (p == 0) first_loss = loss.f;
        CHECK(same_bits(loss.f.data(), first_loss.data(), size_t(N)));
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t j = 0; j < pt.valid; ++j)
            cat_dl[size_t(n * V + pt.offset + j)] = dl.f[size_t(n * pt.size + j)];
          for (int64_t j = pt.valid; j < pt.size; ++j) CHECK(dl.f[size_t(n * pt.size + j)] == 0.f);
        }

        // Without dlogits: only the losses, the same ones.
        Owned loss2({N});
        ops::cross_entropy_vocab_parallel(loss2, Tensor(), lt, targets, all, pt.offset, pt.valid,
                                          grad_scale);
        CHECK(loss2.f == loss.f);

        // In place: dlogits is the logits tensor itself.
        Owned inplace({N, pt.size}), loss3({N});
        inplace.f = locals[size_t(p)];
        ops::cross_entropy_vocab_parallel(loss3, inplace, inplace, targets, all, pt.offset, pt.valid,
                                          grad_scale);
        CHECK(same_bits(loss3.f.data(), loss.f.data(), size_t(N)));
        CHECK(same_bits(inplace.f.data(), dl.f.data(), dl.f.size()));
      }
      for (int64_t j = 0; j < V; ++j) {  // ignored rows: zero gradient, zero loss
        CHECK(cat_dl[size_t(2 * V + j)] == 0.f);
        CHECK(cat_dl[size_t(4 * V + j)] == 0.f);
      }
      CHECK(first_loss[2] == 0.f);
      CHECK(first_loss[4] == 0.f);
      const double e_loss = max_rel(first_loss, ref_loss.f, 1.0);
      const double e_dl = max_rel(cat_dl, ref_dl.f, 1e-2 * grad_scale);
      std::printf("[vocab_parallel] cross-entropy N=%lld V=%lld P=%lld grad_scale=%g (%lld "
                  "padding-only): losses max_rel_err=%.3e dlogits max_rel_err=%.3e (tol %.0e)\n",
                  (long long)N, (long long)V, (long long)P, double(grad_scale),
                  (long long)padding_only, e_loss, e_dl, kTol);
      CHECK(e_loss < kTol);
      CHECK(e_dl < kTol);
      if (P == 6) CHECK(padding_only == 1);
    }
  }
}

TEST_CASE("vocab-parallel cross-entropy: stats of a part, -inf and NaN logits",
          "[ops][vocab_parallel]") {
  // Stats written out by hand for a 2-column part of a 5-id vocabulary
  // (the third column is padding).
  const int64_t N = 6;
  Owned logits({N, 3}), targets({N}, DType::I32), stats({N, 3});
  const float inf = std::numeric_limits<float>::infinity();
  logits.f = {1.f,  2.f,  kNaN,  //
              0.5f, -inf, kNaN,  //
              -inf, -inf, kNaN,  //
              3.f,  3.f,  kNaN,  //
              kNaN, 1.f,  kNaN,  //
              kNaN, kNaN, kNaN};
  targets.i = {3, 2, 3, -1, 2, 2};  // columns [2, 4) are ids 2 and 3
  ops::cross_entropy_partial_stats(stats, logits, targets, 2, 2, 5);
  const std::vector<float> expect = {2.f, float(1 + std::exp(-1.0)), 2.f,  //
                                     0.5f, 1.f, 0.5f,                      //
                                     -inf, 0.f, -inf,                      //
                                     3.f, 2.f, 0.f};
  CHECK(std::vector<float>(stats.f.begin(), stats.f.begin() + 12) == expect);
  // NaN is never laundered: the max skips it, the sum keeps it, also when
  // every valid logit is NaN.
  CHECK(stats.f[12] == 1.f);
  CHECK(std::isnan(stats.f[13]));
  CHECK(stats.f[15] == -inf);
  CHECK(std::isnan(stats.f[16]));
  Owned all1({1, N, 3}), losses({N});
  all1.f = stats.f;
  ops::cross_entropy_vocab_parallel(losses, Tensor(), logits, targets, all1, 2, 2, 1.f);
  CHECK(std::isnan(losses.f[4]));
  CHECK(std::isnan(losses.f[5]));

  // A row whose every logit on every rank is -inf has no probability: NaN,
  // as in the fused op; a rank with only -inf logits just adds nothing.
  Owned all({2, 1, 3}), t1({1}, DType::I32), loss({1}), row({1, 2}), dl({1, 2});
  t1.i = {0};
  row.f = {-inf, -inf};
  all.f = {-inf, 0.f, -inf, -inf, 0.f, 0.f};
  ops::cross_entropy_vocab_parallel(loss, dl, row, t1, all, 0, 2, 1.f);
  CHECK(std::isnan(loss.f[0]));
  CHECK(std::isnan(dl.f[1]));
  all.f = {-inf, 0.f, -inf, 1.f, 1.f, 0.f};  // the other rank holds all the mass
  ops::cross_entropy_vocab_parallel(loss, dl, row, t1, all, 0, 2, 1.f);
  CHECK(loss.f[0] == inf);
  CHECK(dl.f[0] == -1.f);
  CHECK(dl.f[1] == 0.f);
}

TEST_CASE("vocab-parallel cross-entropy: bad targets and arguments are refused by name",
          "[ops][vocab_parallel]") {
  const int64_t N = 7, V = 13;
  const Part pt = part_of(V, 2, 1);  // columns [7, 14), 6 real
  Owned logits({N, pt.size}), targets({N}, DType::I32), stats({N, 3}), losses({N}), dl({N, pt.size});
  fill_normal(logits.f, 230);
  fill_ints(targets.i, 231, 0, int(V));
  Owned all({2, N, 3});
  fill_normal(all.f, 232);
  for (int64_t i = 1; i < 2 * N * 3; i += 3) all.f[size_t(i)] = 1.f + std::fabs(all.f[size_t(i)]);

  targets.i[3] = int32_t(V);
  stats.f.assign(stats.f.size(), 5.f);
  REQUIRE_THROWS_WITH(
      ops::cross_entropy_partial_stats(stats, logits, targets, pt.offset, pt.valid, V),
      "cross_entropy_partial_stats: target 13 at row 3 is outside the vocabulary [0, 13)");
  CHECK(stats.f == std::vector<float>(stats.f.size(), 5.f));  // nothing written
  targets.i[3] = 1;

  Owned bad_rows({2, N + 1, 3}), flat({N, 3}), no_ranks({0, N, 3}), bad_width({2, N, 2});
  for (Owned* bad : {&bad_rows, &flat, &no_ranks, &bad_width})
    require_rejected(
        [&] {
          ops::cross_entropy_vocab_parallel(losses, dl, logits, targets, *bad, pt.offset, pt.valid,
                                            1.f);
        },
        {"cross_entropy_vocab_parallel: ", "all_stats ", "expected [P, 7, 3] with P >= 1"});
  Owned bad_stats({N, 4});
  require_rejected(
      [&] { ops::cross_entropy_partial_stats(bad_stats, logits, targets, pt.offset, pt.valid, V); },
      {"cross_entropy_partial_stats: ", "stats [7, 4]", "expected [7, 3]"});
  require_rejected(
      [&] { ops::cross_entropy_partial_stats(stats, logits, targets, pt.offset, pt.size + 1, V); },
      {"cross_entropy_partial_stats: ", "valid_cols 8 must lie in [0, 7]"});
  require_rejected(
      [&] { ops::cross_entropy_vocab_parallel(losses, dl, logits, targets, all, -1, pt.valid, 1.f); },
      {"cross_entropy_vocab_parallel: ", "vocab_offset -1 must be >= 0"});
  require_rejected(
      [&] { ops::cross_entropy_partial_stats(stats, logits, targets, pt.offset, pt.size, V); },
      {"cross_entropy_partial_stats: ", "vocab_offset 7 + valid_cols 7 is past the vocabulary [0, 13)"});
  Owned short_targets({N - 1}, DType::I32);
  require_rejected(
      [&] { ops::cross_entropy_partial_stats(stats, logits, short_targets, pt.offset, pt.valid, V); },
      {"cross_entropy_partial_stats: ", "logits [7, 7] vs targets [6]"});
  Owned f32_targets({N});
  require_rejected(
      [&] { ops::cross_entropy_partial_stats(stats, logits, f32_targets, pt.offset, pt.valid, V); },
      {"cross_entropy_partial_stats: ", "targets [7] is F32, expected I32"});

  // dlogits may be logits itself, but no other overlap is allowed.
  const Tensor shifted(logits.f.data() + 1, DType::F32, {N - 1, pt.size});
  Owned six({N - 1}, DType::I32), all6({2, N - 1, 3}), loss6({N - 1});
  const Tensor six_rows(logits.f.data(), DType::F32, {N - 1, pt.size});
  require_rejected(
      [&] { ops::cross_entropy_vocab_parallel(loss6, shifted, six_rows, six, all6, pt.offset, pt.valid, 1.f); },
      {"cross_entropy_vocab_parallel: ", "partially overlaps logits"});
  const Tensor losses_in_stats(all.f.data(), DType::F32, {N});
  require_rejected(
      [&] {
        ops::cross_entropy_vocab_parallel(losses_in_stats, dl, logits, targets, all, pt.offset,
                                          pt.valid, 1.f);
      },
      {"cross_entropy_vocab_parallel: ", "losses [7] overlaps all_stats [2, 7, 3]"});
}
