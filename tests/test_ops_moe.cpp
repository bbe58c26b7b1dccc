// MoE ops of the CPU reference: router, aux loss, dispatch plan, permute /
// unpermute, grouped linear. Forwards are checked against float64
// recomputation written here, backwards against central finite differences,
// and the dispatch plan against hand-worked cases. A last pair of tests runs a
// whole MoE FFN through the ops and compares it with a naive per-token loop.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

using namespace trainer;
using namespace trainer::test;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Permute, unpermute and grouped linear are linear in each input taken
// alone, so central differences have no truncation error at any step; a
// large step shrinks the fp32 rounding noise of the loss by the same factor.
constexpr double kLinearStep = 0.1;

// Logits whose per-row ranking is never in doubt: a shuffled ladder with
// 0.8 between rungs plus noise of at most 0.1. A finite-difference step of
// 1e-2 then cannot change which experts are selected, so the checks see a
// smooth function.
std::vector<float> separated_logits(int64_t N, int64_t E, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  std::vector<float> v(static_cast<size_t>(N * E));
  std::vector<int> rank(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(rank.begin(), rank.end(), 0);
    std::shuffle(rank.begin(), rank.end(), g);
    for (int64_t e = 0; e < E; ++e) v[size_t(n * E + e)] = 0.8f * float(rank[size_t(e)]) + noise(g);
  }
  return v;
}

struct RefRoute {
  std::vector<double> probs;  // [N,E]
  std::vector<int> idx;       // [N,K]
  std::vector<double> w;      // [N,K]
};

RefRoute ref_route(const std::vector<float>& logits, int64_t N, int64_t E, int64_t K,
                   bool normalize) {
  RefRoute r;
  r.probs.resize(size_t(N * E));
  r.idx.resize(size_t(N * K));
  r.w.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(logits[size_t(n * E + e)]));
    for (int64_t e = 0; e < E; ++e) s += std::exp(double(logits[size_t(n * E + e)]) - mx);
    for (int64_t e = 0; e < E; ++e)
      r.probs[size_t(n * E + e)] = std::exp(double(logits[size_t(n * E + e)]) - mx) / s;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    const double* p = &r.probs[size_t(n * E)];
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double ws = 0;
    for (int64_t k = 0; k < K; ++k) ws += p[order[size_t(k)]];
    for (int64_t k = 0; k < K; ++k) {
      r.idx[size_t(n * K + k)] = order[size_t(k)];
      r.w[size_t(n * K + k)] = p[order[size_t(k)]] / (normalize ? ws : 1.0);
    }
  }
  return r;
}

// Independent admission rule from MODEL_MATH.md: k-major, tokens in order,
// an expert takes at most `capacity` assignments. Returns kept[n*K+k].
std::vector<char> ref_admit(const std::vector<int>& idx, int64_t N, int64_t K, int64_t E,
                            int capacity) {
  std::vector<char> kept(size_t(N * K), 0);
  std::vector<int> load(size_t(E), 0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      int e = idx[size_t(n * K + k)];
      if (capacity <= 0 || load[size_t(e)] < capacity) {
        ++load[size_t(e)];
        kept[size_t(n * K + k)] = 1;
      }
    }
  return kept;
}

// Owned's tensor points into its vector; moving a new vector in would leave
// the tensor on freed memory, so values are copied into the existing buffer.
void set_values(Owned& o, const std::vector<float>& v) {
  REQUIRE(v.size() == o.f.size());
  std::copy(v.begin(), v.end(), o.f.begin());
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

bool all_zero(const float* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0.f) return false;  // also false for NaN
  return true;
}

}  // namespace

// ---- router -----------------------------------------------------------------

TEST_CASE("moe_route_forward matches float64 softmax and top-k", "[moe]") {
  const int64_t N = 12, E = 4, K = 2;
  for (bool normalize : {false, true}) {
    Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K});
    fill_normal(logits.f, 11, 1.5f);
    cpu::moe_route_forward(probs, idx, w, logits, normalize);
    RefRoute r = ref_route(logits.f, N, E, K, normalize);
    double ep = max_rel_diff(probs.p(), r.probs.data(), r.probs.size());
    double ew = max_rel_diff(w.p(), r.w.data(), r.w.size());
    std::printf("[forward] moe_route normalize=%d probs rel=%.3e topk_w rel=%.3e\n", normalize, ep,
                ew);
    REQUIRE(ep < 1e-6);
    REQUIRE(ew < 1e-6);
    for (size_t i = 0; i < r.idx.size(); ++i) REQUIRE(idx.i[i] == r.idx[i]);
  }
}

TEST_CASE("moe_route_forward breaks ties toward the lower expert index", "[moe]") {
  const int64_t E = 4, K = 2;
  Owned logits({3, E}), probs({3, E}), idx({3, K}, DType::I32), w({3, K});
  logits.f = {0, 0, 0, 0,   // all equal: experts 0 then 1
              0, 1, 0, 1,   // two equal maxima: 1 then 3
              2, 1, 0, 1};  // runner-up tie between 1 and 3: 1
  cpu::moe_route_forward(probs, idx, w, logits, /*normalize=*/true);
  CHECK(idx.i == std::vector<int32_t>{0, 1, 1, 3, 0, 1});
  CHECK(w.f[0] == Approx(0.5));
  CHECK(w.f[2] == Approx(0.5));
}

TEST_CASE("moe_route_forward accepts probs aliasing logits", "[moe]") {
  const int64_t N = 5, E = 4, K = 2;
  Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}), idx2({N, K}, DType::I32),
      w2({N, K});
  fill_normal(logits.f, 5);
  cpu::moe_route_forward(probs, idx, w, logits, true);
  cpu::moe_route_forward(logits, idx2, w2, logits, true);
  CHECK(logits.f == probs.f);
  CHECK(idx.i == idx2.i);
  CHECK(w.f == w2.f);
}

namespace {

// The aux loss of a micro-batch as the model forms it: statistics, then the loss.
void aux_of(Owned& aux, Owned& stats, Owned& probs, Owned& idx) {
  cpu::moe_router_stats(stats, probs, idx);
  cpu::moe_aux_loss_forward(aux, stats, int(probs.t.dim(0)), int(idx.t.dim(1)));
}

}  // namespace

TEST_CASE("moe_aux_loss_forward matches float64 and the balanced value 1", "[moe]") {
  const int64_t N = 12, E = 4, K = 2;
  Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}), aux({1}), stats({2, E});
  fill_normal(logits.f, 21, 2.f);
  cpu::moe_route_forward(probs, idx, w, logits, true);
  aux_of(aux, stats, probs, idx);
  std::vector<double> f(E, 0), P(E, 0);
  for (int32_t e : idx.i) f[size_t(e)] += 1.0 / double(N * K);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) P[size_t(e)] += double(probs.f[size_t(n * E + e)]) / double(N);
  double ref = 0;
  for (int64_t e = 0; e < E; ++e) ref += double(E) * f[size_t(e)] * P[size_t(e)];
  double err = std::fabs(aux.f[0] - ref) / ref;
  std::printf("[forward] moe_aux_loss aux=%.6f ref=%.6f rel=%.3e\n", aux.f[0], ref, err);
  REQUIRE(err < 1e-6);
  for (int64_t e = 0; e < E; ++e) {
    CHECK(stats.f[size_t(e)] == float(f[size_t(e)] * double(N * K)));
    CHECK(std::fabs(stats.f[size_t(E + e)] - P[size_t(e)] * double(N)) < 1e-5);
  }

  // Uniform router and perfectly balanced assignments: aux = E * E * (1/E)(1/E) = 1.
  Owned up({4, E}), bidx({4, K}, DType::I32);
  std::fill(up.f.begin(), up.f.end(), 0.25f);
  bidx.i = {0, 1, 2, 3, 1, 0, 3, 2};
  aux_of(aux, stats, up, bidx);
  REQUIRE(aux.f[0] == Approx(1.0).epsilon(1e-6));

  bidx.i[3] = 4;
  test::require_rejected([&] { ops::moe_router_stats(stats, up, bidx); }, {"moe_router_stats: ", "topk_idx[1,1] = 4 is outside [0, 4)"});
  Owned wrong({2, E + 1});
  test::require_rejected([&] { ops::moe_aux_loss_forward(aux, wrong, 4, 0); }, {"moe_aux_loss_forward: ", "topk = 0 must be >= 1"});
  test::require_rejected([&] { ops::moe_route_backward(probs, Tensor(), probs, idx, w, true, 0.5f, Tensor(), int(N)); },
                         {"moe_route_backward: ", "aux_grad != 0 needs the router statistics"});
  test::require_rejected([&] { ops::moe_route_backward(probs, Tensor(), probs, idx, w, true, 0.5f, stats, int(N - 1)); },
                         {"moe_route_backward: ", "tokens = 11 must count at least this rank's 12 tokens"});
}

// Context parallelism splits a micro-batch's tokens over ranks: statistics
// summed over the parts must give the whole batch's loss, and each part's
// backward with the summed statistics must be the whole backward's rows.
TEST_CASE("moe router statistics of split tokens add up to the whole micro-batch's", "[moe]") {
  const int64_t N = 16, E = 6, K = 2, half = N / 2;
  Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}), aux({1}), stats({2, E});
  fill_normal(logits.f, 61, 2.f);
  cpu::moe_route_forward(probs, idx, w, logits, true);
  aux_of(aux, stats, probs, idx);
  Owned part({2, E}), sum({2, E}), aux_parts({1});
  for (int64_t p = 0; p < 2; ++p) {
    cpu::moe_router_stats(part, probs.t.slice0(p * half, (p + 1) * half), idx.t.slice0(p * half, (p + 1) * half));
    for (size_t i = 0; i < sum.f.size(); ++i) sum.f[i] += part.f[i];
  }
  cpu::moe_aux_loss_forward(aux_parts, sum, int(N), int(K));
  const double err = std::fabs(double(aux_parts.f[0]) - aux.f[0]);
  std::printf("[forward] aux from split statistics %.8f, whole %.8f, |diff| %.2e\n", aux_parts.f[0], aux.f[0], err);
  REQUIRE(err < 1e-6);

  Owned G({N, K}), whole({N, E}), mine({half, E});
  fill_normal(G.f, 62);
  cpu::moe_route_backward(whole, G, probs, idx, w, true, 0.9f, stats, int(N));
  double worst = 0;
  for (int64_t p = 0; p < 2; ++p) {
    const auto rows = [&](Owned& t) { return t.t.slice0(p * half, (p + 1) * half); };
    cpu::moe_route_backward(mine, rows(G), rows(probs), rows(idx), rows(w), true, 0.9f, sum, int(N));
    for (int64_t i = 0; i < half * E; ++i)
      worst = std::max(worst, double(std::fabs(mine.f[size_t(i)] - whole.f[size_t(p * half * E + i)])));
  }
  std::printf("[backward] split-token router gradient vs whole: max |diff| %.2e\n", worst);
  REQUIRE(worst < 1e-6);
}

TEST_CASE("moe_route_backward matches finite differences", "[moe][gradcheck]") {
  const int64_t N = 10, E = 4, K = 2;
  const double tol = 5e-3;
  for (bool normalize : {false, true})
    for (float aux_grad : {0.f, 0.7f}) {
      Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}), aux({1}), G({N, K}),
          dlogits({N, E}), stats({2, E});
      set_values(logits, separated_logits(N, E, 31));
      fill_normal(G.f, 32);
      cpu::moe_route_forward(probs, idx, w, logits, normalize);
      const std::vector<int32_t> base_idx = idx.i;
      bool selection_changed = false;
      // loss = sum G * topk_w + aux_grad * aux, all through the op forwards.
      auto loss = [&]() {
        cpu::moe_route_forward(probs, idx, w, logits, normalize);
        aux_of(aux, stats, probs, idx);
        if (idx.i != base_idx) selection_changed = true;
        double L = double(aux_grad) * aux.f[0];
        for (size_t i = 0; i < G.f.size(); ++i) L += double(G.f[i]) * w.f[i];
        return L;
      };
      loss();
      std::fill(dlogits.f.begin(), dlogits.f.end(), kNaN);  // must be overwritten
      cpu::moe_route_backward(dlogits, G, probs, idx, w, normalize, aux_grad, stats, int(N));
      const std::vector<float> analytic = dlogits.f;
      char label[96];
      std::snprintf(label, sizeof label, "moe_route dlogits norm=%d aux_grad=%.1f", normalize,
                    aux_grad);
      GradCheckResult r = grad_check(label, logits.f, analytic, loss, 1e-2, 1e-2);
      REQUIRE_FALSE(selection_changed);
      REQUIRE(r.max_rel_err < tol);
      // Softmax gradients sum to zero per row, whatever feeds them.
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += analytic[size_t(n * E + e)];
        REQUIRE(std::fabs(s) < 1e-6);
      }
    }
}

TEST_CASE("moe_route_backward: the aux path alone matches finite differences", "[moe][gradcheck]") {
  // With no combine-weight gradient the whole dlogits comes from the aux
  // loss, so a wrong or missing aux term cannot hide behind the larger
  // top-k term.
  const int64_t N = 9, E = 4, K = 2;
  const float aux_grad = 1.3f;
  Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}), zero({N, K}), d1({N, E}),
      d2({N, E}), stats({2, E});
  set_values(logits, separated_logits(N, E, 41));
  cpu::moe_route_forward(probs, idx, w, logits, true);
  cpu::moe_router_stats(stats, probs, idx);
  const std::vector<int32_t> base_idx = idx.i;
  cpu::moe_route_backward(d1, zero, probs, idx, w, true, aux_grad, stats, int(N));
  cpu::moe_route_backward(d2, Tensor(), probs, idx, w, true, aux_grad, stats, int(N));  // absent dtopk_w
  CHECK(d1.f == d2.f);
  REQUIRE(max_abs(d1.f) > 1e-3);
  // The loss is recomputed in float64 (the aux forward is checked against
  // float64 above): aux gradients are small, and fp32 rounding of the loss
  // would dominate their finite differences. f_e is fixed by the selection.
  std::vector<double> f(size_t(E), 0.0);
  for (int32_t e : base_idx) f[size_t(e)] += 1.0 / double(N * K);
  auto loss = [&]() {
    RefRoute rr = ref_route(logits.f, N, E, K, true);
    double a = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e)
        a += double(E) * f[size_t(e)] * rr.probs[size_t(n * E + e)] / double(N);
    return double(aux_grad) * a;
  };
  GradCheckResult r =
      grad_check("moe_route dlogits aux only (f64 loss)", logits.f, d1.f, loss, 1e-2, 1e-3);
  REQUIRE(r.max_rel_err < 1e-3);
}

TEST_CASE("moe_route_forward rejects K > E and mismatched shapes", "[moe]") {
  Owned logits({3, 2}), probs({3, 2}), idx({3, 3}, DType::I32), w({3, 3}), p_bad({3, 4}),
      idx2({3, 2}, DType::I32), w2({3, 2});
  test::require_rejected([&] { ops::moe_route_forward(probs, idx, w, logits, true); }, {"moe_route_forward: ", "K = 3 (topk_idx [3, 3]) must be in [1, E = 2]"});
  test::require_rejected([&] { ops::moe_route_forward(p_bad, idx2, w2, logits, true); }, {"moe_route_forward: ", "probs [3, 4] must match logits [3, 2]"});
  test::require_rejected([&] { ops::moe_route_forward(probs, idx2, w, logits, true); }, {"moe_route_forward: ", "topk_w [3, 3] must match topk_idx [3, 2]"});
  REQUIRE_NOTHROW(cpu::moe_route_forward(probs, idx2, w2, logits, true));
}

// ---- dispatch plan ----------------------------------------------------------

namespace {
// Six tokens, four experts, two choices each. Worked by hand below.
const std::vector<int32_t> kPlanIdx = {0, 1,   // n0
                                       0, 2,   // n1
                                       0, 1,   // n2
                                       1, 0,   // n3
                                       2, 0,   // n4
                                       1, 3};  // n5
}  // namespace

TEST_CASE("moe_dispatch_plan admits k-major under a capacity", "[moe][plan]") {
  const int64_t N = 6, K = 2;
  const int E = 4;
  Owned idx({N, K}, DType::I32), row_map({N, K}, DType::I32), offsets({E + 1}, DType::I32);
  idx.i = kPlanIdx;

  SECTION("capacity 2") {
    // k = 0: n0->e0, n1->e0, n2->e0 dropped (full), n3->e1, n4->e2, n5->e1.
    // k = 1: n0->e1 dropped, n1->e2, n2->e1 dropped, n3->e0 dropped,
    //        n4->e0 dropped, n5->e3.
    // A token-major rule would instead keep n2's second choice (e1) and drop
    // n5's first choice: the two rules differ on this input.
    cpu::moe_dispatch_plan(row_map, offsets, idx, E, 2, {});
    CHECK(offsets.i == std::vector<int32_t>{0, 2, 4, 6, 7});
    // Rows within an expert follow admission order.
    CHECK(row_map.i == std::vector<int32_t>{0, -1,   //
                                            1, 5,    //
                                            -1, -1,  // every choice of n2 dropped
                                            2, -1,   //
                                            4, -1,   //
                                            3, 6});
  }
  SECTION("capacity 1") {
    cpu::moe_dispatch_plan(row_map, offsets, idx, E, 1, {});
    CHECK(offsets.i == std::vector<int32_t>{0, 1, 2, 3, 4});
    CHECK(row_map.i == std::vector<int32_t>{0, -1, -1, -1, -1, -1, 1, -1, 2, -1, -1, 3});
  }
  SECTION("dropless keeps all N*K, for capacity 0 and negative") {
    for (int cap : {0, -1}) {
      std::fill(row_map.i.begin(), row_map.i.end(), -7);
      cpu::moe_dispatch_plan(row_map, offsets, idx, E, cap, {});
      // Loads: e0 = 5 (n0,n1,n2 first; n3,n4 second), e1 = 4, e2 = 2, e3 = 1.
      CHECK(offsets.i == std::vector<int32_t>{0, 5, 9, 11, 12});
      CHECK(row_map.i == std::vector<int32_t>{0, 7, 1, 10, 2, 8, 5, 3, 9, 4, 6, 11});
    }
  }
  SECTION("capacity at least the largest load is dropless") {
    cpu::moe_dispatch_plan(row_map, offsets, idx, E, 5, {});
    CHECK(offsets.i == std::vector<int32_t>{0, 5, 9, 11, 12});
  }
}

TEST_CASE("moe_dispatch_plan invariants on random routing", "[moe][plan]") {
  const int64_t N = 16, K = 2;
  const int E = 4;
  Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}),
      row_map({N, K}, DType::I32), offsets({E + 1}, DType::I32);
  fill_normal(logits.f, 51, 2.f);
  cpu::moe_route_forward(probs, idx, w, logits, true);
  for (int cap : {0, 1, 3, 6, 100}) {
    cpu::moe_dispatch_plan(row_map, offsets, idx, E, cap, {});
    std::vector<char> kept = ref_admit(std::vector<int>(idx.i.begin(), idx.i.end()), N, K, E, cap);
    const int64_t total = std::count(kept.begin(), kept.end(), 1);
    REQUIRE(offsets.i[0] == 0);
    REQUIRE(offsets.i[E] == total);
    if (cap <= 0) REQUIRE(total == N * K);
    std::vector<int> seen(size_t(N * K), 0);
    for (int64_t i = 0; i < N * K; ++i) {
      REQUIRE((row_map.i[size_t(i)] >= 0) == bool(kept[size_t(i)]));
      if (!kept[size_t(i)]) continue;
      const int r = row_map.i[size_t(i)], e = idx.i[size_t(i)];
      REQUIRE(r >= offsets.i[size_t(e)]);
      REQUIRE(r < offsets.i[size_t(e + 1)]);
      ++seen[size_t(r)];
    }
    for (int64_t r = 0; r < N * K; ++r) REQUIRE(seen[size_t(r)] == (r < total ? 1 : 0));
    for (int e = 0; e < E; ++e)
      if (cap > 0) REQUIRE(offsets.i[size_t(e + 1)] - offsets.i[size_t(e)] <= cap);
  }
}

TEST_CASE("moe_dispatch_plan: assignments not admitted are dropped before the capacity counts", "[moe][plan]") {
  const int64_t N = 6, K = 2;
  const int E = 4;
  Owned idx({N, K}, DType::I32), admitted({N, K}, DType::I32), row_map({N, K}, DType::I32),
      offsets({E + 1}, DType::I32), free_map({N, K}, DType::I32), free_off({E + 1}, DType::I32);
  idx.i = kPlanIdx;
  // n0's first choice (e0) and n3's second (e0) were refused elsewhere.
  admitted.i = {-1, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 0};
  // Capacity 2: e0 now takes n1 and n2 (n0 no longer counts), n4's e0 is over it.
  cpu::moe_dispatch_plan(row_map, offsets, idx, E, 2, admitted);
  CHECK(offsets.i == std::vector<int32_t>{0, 2, 4, 6, 7});
  CHECK(row_map.i == std::vector<int32_t>{-1, -1, 0, 5, 1, -1, 2, -1, 4, -1, 3, 6});
  // Without a capacity exactly the admitted ones are kept, in the plan's order.
  cpu::moe_dispatch_plan(row_map, offsets, idx, E, 0, admitted);
  cpu::moe_dispatch_plan(free_map, free_off, idx, E, 0, {});
  for (int64_t i = 0; i < N * K; ++i) CHECK((row_map.i[size_t(i)] < 0) == (admitted.i[size_t(i)] < 0));
  CHECK(offsets.i[size_t(E)] == free_off.i[size_t(E)] - 2);
  Owned short_adm({N - 1, K}, DType::I32);
  test::require_rejected([&] { ops::moe_dispatch_plan(row_map, offsets, idx, E, 0, short_adm); },
                         {"moe_dispatch_plan: ", "admitted [5, 2] must match topk_idx [6, 2]"});
}

TEST_CASE("moe_dispatch_plan: an expert nobody picks gets an empty range", "[moe][plan]") {
  Owned idx({3, 2}, DType::I32), row_map({3, 2}, DType::I32), offsets({5}, DType::I32);
  idx.i = {0, 1, 1, 3, 3, 0};
  cpu::moe_dispatch_plan(row_map, offsets, idx, 4, 0, {});
  CHECK(offsets.i == std::vector<int32_t>{0, 2, 4, 4, 6});
  CHECK(row_map.i == std::vector<int32_t>{0, 3, 2, 5, 4, 1});
}

TEST_CASE("moe_dispatch_plan rejects bad inputs", "[moe][plan]") {
  Owned idx({3, 2}, DType::I32), row_map({3, 2}, DType::I32), offsets({5}, DType::I32),
      short_off({4}, DType::I32), short_map({2, 2}, DType::I32);
  idx.i = {0, 1, 1, 3, 3, 4};
  test::require_rejected([&] { ops::moe_dispatch_plan(row_map, offsets, idx, 4, 0, {}); }, {"moe_dispatch_plan: ", "topk_idx[2,1] = 4 is outside [0, 4)"});
  idx.i[5] = 0;
  test::require_rejected([&] { ops::moe_dispatch_plan(row_map, short_off, idx, 4, 0, {}); }, {"moe_dispatch_plan: ", "offsets [4] must be [E+1] = [5]"});
  test::require_rejected([&] { ops::moe_dispatch_plan(short_map, offsets, idx, 4, 0, {}); }, {"moe_dispatch_plan: ", "row_map [2, 2] must match topk_idx [3, 2]"});
  try {
    ops::moe_dispatch_plan(row_map, short_off, idx, 4, 0, {});
  } catch (const std::invalid_argument& e) {
    std::printf("[message] %s\n", e.what());
    CHECK(std::string(e.what()).find("moe_dispatch_plan") != std::string::npos);
    CHECK(std::string(e.what()).find("[4]") != std::string::npos);
  }
}

// ---- permute / unpermute ----------------------------------------------------

namespace {
// Random routing of N tokens with a capacity that drops some assignments.
struct Plan {
  int64_t N, E, K;
  Owned idx, w, row_map, offsets;
  int64_t kept = 0;
  Plan(int64_t N_, int64_t E_, int64_t K_, int capacity, uint64_t seed)
      : N(N_), E(E_), K(K_), idx({N_, K_}, DType::I32), w({N_, K_}), row_map({N_, K_}, DType::I32),
        offsets({E_ + 1}, DType::I32) {
    Owned logits({N, E}), probs({N, E});
    fill_normal(logits.f, seed, 2.f);
    cpu::moe_route_forward(probs, idx, w, logits, true);
    cpu::moe_dispatch_plan(row_map, offsets, idx, int(E), capacity, {});
    kept = offsets.i[size_t(E)];
  }
};
}  // namespace

TEST_CASE("moe_permute and moe_permute_backward", "[moe][gradcheck]") {
  const int64_t N = 12, E = 4, K = 2, C = 8;
  Plan plan(N, E, K, /*capacity=*/5, 61);
  REQUIRE(plan.kept < N * K);  // the case must actually drop something
  Owned x({N, C}), xp({N * K, C}), G({N * K, C}), dx({N, C});
  fill_normal(x.f, 62);
  fill_normal(G.f, 63);
  std::fill(xp.f.begin(), xp.f.end(), kNaN);
  cpu::moe_permute(xp, x, plan.row_map);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      int r = plan.row_map.i[size_t(n * K + k)];
      if (r >= 0) REQUIRE(std::equal(x.p() + n * C, x.p() + (n + 1) * C, xp.p() + r * C));
    }
  REQUIRE(all_zero(xp.p() + plan.kept * C, size_t((N * K - plan.kept) * C)));

  // Backward accumulates into dx.
  std::vector<float> d0(static_cast<size_t>(N * C));
  fill_normal(d0, 64);
  set_values(dx, d0);
  cpu::moe_permute_backward(dx, G, plan.row_map);
  std::vector<float> analytic(static_cast<size_t>(N * C));
  for (size_t i = 0; i < analytic.size(); ++i) analytic[i] = dx.f[i] - d0[i];
  auto loss = [&]() {
    cpu::moe_permute(xp, x, plan.row_map);
    double L = 0;
    for (size_t i = 0; i < G.f.size(); ++i) L += double(G.f[i]) * xp.f[i];
    return L;
  };
  GradCheckResult r = grad_check("moe_permute dx", x.f, analytic, loss, kLinearStep);
  REQUIRE(r.max_rel_err < 1e-3);

  Owned bad({N * K - 1, C});
  test::require_rejected([&] { ops::moe_permute(bad, x, plan.row_map); }, {"moe_permute: ", "x [12, 8] and xp [23, 8] must be [N, C] and [N*K, C]"});
  // Two assignments sharing a row, and a row past N*K.
  std::vector<size_t> kept_at;
  for (size_t i = 0; i < plan.row_map.i.size(); ++i)
    if (plan.row_map.i[i] >= 0) kept_at.push_back(i);
  const int32_t saved = plan.row_map.i[kept_at[0]];
  plan.row_map.i[kept_at[0]] = plan.row_map.i[kept_at[1]];
  test::require_rejected([&] { ops::moe_permute(xp, x, plan.row_map); }, {"moe_permute: ", "is used twice"});
  plan.row_map.i[kept_at[0]] = int32_t(N * K);
  test::require_rejected([&] { ops::moe_permute_backward(dx, G, plan.row_map); }, {"moe_permute_backward: ", "is outside [-1, N*K)"});
  plan.row_map.i[kept_at[0]] = saved;
  REQUIRE_NOTHROW(cpu::moe_permute(xp, x, plan.row_map));
}

TEST_CASE("moe_unpermute and moe_unpermute_backward", "[moe][gradcheck]") {
  const int64_t N = 12, E = 4, K = 2, C = 8;
  Plan plan(N, E, K, /*capacity=*/5, 71);
  REQUIRE(plan.kept < N * K);
  Owned yp({N * K, C}), y({N, C}), G({N, C}), dyp({N * K, C}), dw({N, K});
  fill_normal(yp.f, 72);
  fill_normal(G.f, 73);
  std::fill(y.f.begin(), y.f.end(), kNaN);
  cpu::moe_unpermute(y, yp, plan.row_map, plan.w);
  std::vector<double> ref(size_t(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      int r = plan.row_map.i[size_t(n * K + k)];
      if (r < 0) continue;
      for (int64_t c = 0; c < C; ++c)
        ref[size_t(n * C + c)] += double(plan.w.f[size_t(n * K + k)]) * yp.f[size_t(r * C + c)];
    }
  // Absolute floor: a token with every choice dropped has y = 0 exactly.
  double ef = max_rel_diff(y.p(), ref.data(), ref.size(), 1e-3);
  std::printf("[forward] moe_unpermute rel=%.3e\n", ef);
  REQUIRE(ef < 1e-6);

  std::fill(dyp.f.begin(), dyp.f.end(), kNaN);
  std::fill(dw.f.begin(), dw.f.end(), kNaN);
  cpu::moe_unpermute_backward(dyp, dw, G, yp, plan.row_map, plan.w);
  REQUIRE(all_zero(dyp.p() + plan.kept * C, size_t((N * K - plan.kept) * C)));
  for (size_t i = 0; i < dw.f.size(); ++i)
    if (plan.row_map.i[i] < 0) REQUIRE(dw.f[i] == 0.f);
  const std::vector<float> a_dyp = dyp.f, a_dw = dw.f;
  auto loss = [&]() {
    cpu::moe_unpermute(y, yp, plan.row_map, plan.w);
    double L = 0;
    for (size_t i = 0; i < G.f.size(); ++i) L += double(G.f[i]) * y.f[i];
    return L;
  };
  GradCheckResult r1 = grad_check("moe_unpermute dyp", yp.f, a_dyp, loss, kLinearStep);
  GradCheckResult r2 = grad_check("moe_unpermute dtopk_w", plan.w.f, a_dw, loss, kLinearStep);
  REQUIRE(r1.max_rel_err < 1e-3);
  REQUIRE(r2.max_rel_err < 1e-3);

  // Absent dtopk_w: the same dyp, nothing else written.
  Owned dyp2({N * K, C});
  cpu::moe_unpermute_backward(dyp2, Tensor(), G, yp, plan.row_map, plan.w);
  CHECK(dyp2.f == a_dyp);
}

// ---- grouped linear ---------------------------------------------------------

TEST_CASE("grouped_linear forward and backward", "[moe][gradcheck]") {
  const int64_t E = 4, IC = 8, OC = 6, R = 20;
  Owned inp({R, IC}), weight({E, OC, IC}), offsets({E + 1}, DType::I32), out({R, OC}), G({R, OC}),
      dinp({R, IC}), dweight({E, OC, IC});
  offsets.i = {0, 5, 5, 11, 16};  // expert 1 empty, rows 16..19 are padding
  const int64_t kept = 16;
  fill_normal(inp.f, 81);
  fill_normal(weight.f, 82, 0.5f);
  fill_normal(G.f, 83);
  std::fill(out.f.begin(), out.f.end(), kNaN);
  cpu::grouped_linear_forward(out, inp, weight, offsets);
  std::vector<double> ref(size_t(R * OC), 0.0);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets.i[size_t(e)]; r < offsets.i[size_t(e + 1)]; ++r)
      for (int64_t o = 0; o < OC; ++o) {
        double s = 0;
        for (int64_t i = 0; i < IC; ++i)
          s += double(inp.f[size_t(r * IC + i)]) * weight.f[size_t((e * OC + o) * IC + i)];
        ref[size_t(r * OC + o)] = s;
      }
  // Floor 0.1 (outputs are O(1)): fp32 dot products of 8 terms carry ~1e-7
  // absolute error, which a tiny floor would blow up on near-zero outputs.
  double ef = max_rel_diff(out.p(), ref.data(), ref.size(), 0.1);
  std::printf("[forward] grouped_linear rel=%.3e\n", ef);
  REQUIRE(ef < 1e-5);
  REQUIRE(all_zero(out.p() + kept * OC, size_t((R - kept) * OC)));

  std::fill(dinp.f.begin(), dinp.f.end(), kNaN);
  std::vector<float> dw0(dweight.f.size());
  fill_normal(dw0, 84);
  set_values(dweight, dw0);
  cpu::grouped_linear_backward(dinp, dweight, G, inp, weight, offsets);
  REQUIRE(all_zero(dinp.p() + kept * IC, size_t((R - kept) * IC)));
  std::vector<float> a_dw(dw0.size());
  for (size_t i = 0; i < a_dw.size(); ++i) a_dw[i] = dweight.f[i] - dw0[i];
  const std::vector<float> a_dinp = dinp.f;
  auto loss = [&]() {
    cpu::grouped_linear_forward(out, inp, weight, offsets);
    double L = 0;
    for (size_t i = 0; i < G.f.size(); ++i) L += double(G.f[i]) * out.f[i];
    return L;
  };
  GradCheckResult r1 = grad_check("grouped_linear dinp", inp.f, a_dinp, loss, kLinearStep);
  GradCheckResult r2 = grad_check("grouped_linear dweight (+=)", weight.f, a_dw, loss, kLinearStep);
  REQUIRE(r1.max_rel_err < 1e-3);
  REQUIRE(r2.max_rel_err < 1e-3);
  // The empty expert's weight gets no gradient.
  REQUIRE(all_zero(a_dw.data() + 1 * OC * IC, size_t(OC * IC)));

  // Absent outputs are skipped.
  cpu::grouped_linear_backward(Tensor(), dweight, G, inp, weight, offsets);
  cpu::grouped_linear_backward(dinp, Tensor(), G, inp, weight, offsets);
  CHECK(dinp.f == a_dinp);
}

TEST_CASE("grouped_linear rejects bad offsets and shapes", "[moe]") {
  const int64_t E = 2, IC = 3, OC = 2, R = 6;
  Owned inp({R, IC}), weight({E, OC, IC}), offsets({E + 1}, DType::I32), out({R, OC}),
      bad_out({R, OC + 1}), bad_inp({R, IC + 1});
  offsets.i = {0, 4, 3};
  test::require_rejected([&] { ops::grouped_linear_forward(out, inp, weight, offsets); }, {"grouped_linear_forward: ", "offsets [0, 4, 3] must start at 0"});
  offsets.i = {0, 4, 7};
  test::require_rejected([&] { ops::grouped_linear_forward(out, inp, weight, offsets); }, {"grouped_linear_forward: ", "offsets [0, 4, 7] must start at 0"});
  offsets.i = {1, 4, 6};
  test::require_rejected([&] { ops::grouped_linear_forward(out, inp, weight, offsets); }, {"grouped_linear_forward: ", "offsets [1, 4, 6] must start at 0"});
  offsets.i = {0, 4, 6};
  REQUIRE_NOTHROW(cpu::grouped_linear_forward(out, inp, weight, offsets));
  test::require_rejected([&] { ops::grouped_linear_forward(bad_out, inp, weight, offsets); }, {"grouped_linear_forward: ", "out [6, 3] must be [6, 2] for weight [2, 2, 3]"});
  test::require_rejected([&] { ops::grouped_linear_forward(out, bad_inp, weight, offsets); }, {"grouped_linear_forward: ", "inp [6, 4] must have IC = 3 columns"});
  try {
    ops::grouped_linear_forward(bad_out, inp, weight, offsets);
  } catch (const std::invalid_argument& e) {
    std::printf("[message] %s\n", e.what());
  }
}

// ---- a whole MoE FFN --------------------------------------------------------

namespace {

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// x -> router linear -> route -> plan -> permute -> gate/up grouped linears ->
// silu(gate) * up -> down grouped linear -> unpermute, all through the ops
// except the router matmul and the SwiGLU, which are other files' ops and
// are written out here.
struct MoeFfn {
  static constexpr int64_t N = 16, C = 8, H = 12, E = 4, K = 2;
  int capacity;
  float aux_coef;
  Owned x, Wr, Wg, Wu, Wd;                             // inputs and weights
  Owned logits, probs, idx, w, row_map, offsets, aux, stats;  // routing
  Owned xp, gp, up, ap, yp, y;                         // data path
  Owned G;                                             // upstream dy
  Owned dx, dWr, dWg, dWu, dWd;                        // grads (+= for dW)
  MoeFfn(int cap, float aux_c, uint64_t seed)
      : capacity(cap), aux_coef(aux_c), x({N, C}), Wr({E, C}), Wg({E, H, C}), Wu({E, H, C}),
        Wd({E, C, H}), logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}),
        row_map({N, K}, DType::I32), offsets({E + 1}, DType::I32), aux({1}), stats({2, E}), xp({N * K, C}),
        gp({N * K, H}), up({N * K, H}), ap({N * K, H}), yp({N * K, C}), y({N, C}), G({N, C}),
        dx({N, C}), dWr({E, C}), dWg({E, H, C}), dWu({E, H, C}), dWd({E, C, H}) {
    fill_normal(x.f, seed);
    fill_normal(Wr.f, seed + 1, 0.7f);
    fill_normal(Wg.f, seed + 2, 0.4f);
    fill_normal(Wu.f, seed + 3, 0.4f);
    fill_normal(Wd.f, seed + 4, 0.4f);
    fill_normal(G.f, seed + 5);
  }

  void forward() {
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) {
        double s = 0;
        for (int64_t c = 0; c < C; ++c)
          s += double(x.f[size_t(n * C + c)]) * Wr.f[size_t(e * C + c)];
        logits.f[size_t(n * E + e)] = float(s);
      }
    cpu::moe_route_forward(probs, idx, w, logits, true);
    aux_of(aux, stats, probs, idx);
    cpu::moe_dispatch_plan(row_map, offsets, idx, int(E), capacity, {});
    cpu::moe_permute(xp, x, row_map);
    cpu::grouped_linear_forward(gp, xp, Wg, offsets);
    cpu::grouped_linear_forward(up, xp, Wu, offsets);
    for (size_t i = 0; i < ap.f.size(); ++i) ap.f[i] = float(silu(gp.f[i]) * up.f[i]);
    cpu::grouped_linear_forward(yp, ap, Wd, offsets);
    cpu::moe_unpermute(y, yp, row_map, w);
  }

  double loss() {
    forward();
    double L = double(aux_coef) * aux.f[0];
    for (size_t i = 0; i < G.f.size(); ++i) L += double(G.f[i]) * y.f[i];
    return L;
  }

  void backward() {
    Owned dyp({N * K, C}), dw({N, K}), dap({N * K, H}), dgp({N * K, H}), dup({N * K, H}),
        dxp({N * K, C}), dxp_u({N * K, C}), dlogits({N, E});
    cpu::moe_unpermute_backward(dyp, dw, G, yp, row_map, w);
    cpu::grouped_linear_backward(dap, dWd, dyp, ap, Wd, offsets);
    for (size_t i = 0; i < dap.f.size(); ++i) {
      double g = gp.f[i], s = 1.0 / (1.0 + std::exp(-g));
      dgp.f[i] = float(dap.f[i] * up.f[i] * s * (1.0 + g * (1.0 - s)));
      dup.f[i] = float(dap.f[i] * g * s);
    }
    cpu::grouped_linear_backward(dxp, dWg, dgp, xp, Wg, offsets);
    cpu::grouped_linear_backward(dxp_u, dWu, dup, xp, Wu, offsets);
    for (size_t i = 0; i < dxp.f.size(); ++i) dxp.f[i] += dxp_u.f[i];
    cpu::moe_route_backward(dlogits, dw, probs, idx, w, true, aux_coef, stats, int(N));
    // Router linear backward: dx = dlogits @ Wr (overwrite), dWr += dlogits^T x.
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e)
          s += double(dlogits.f[size_t(n * E + e)]) * Wr.f[size_t(e * C + c)];
        dx.f[size_t(n * C + c)] = float(s);
      }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t n = 0; n < N; ++n)
          s += double(dlogits.f[size_t(n * E + e)]) * x.f[size_t(n * C + c)];
        dWr.f[size_t(e * C + c)] += float(s);
      }
    cpu::moe_permute_backward(dx, dxp, row_map);  // += onto the router's share
  }
};

// The same layer as a per-token loop in double, sharing nothing with the ops
// but the weights. Returns y [N,C] and the number of kept assignments.
std::vector<double> naive_moe(const MoeFfn& m, int64_t* kept_out) {
  const int64_t N = m.N, C = m.C, H = m.H, E = m.E, K = m.K;
  std::vector<int> idx(static_cast<size_t>(N * K));
  std::vector<double> wts(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> p(static_cast<size_t>(E));
    double mx = -1e300, s = 0;
    for (int64_t e = 0; e < E; ++e) {
      double l = 0;
      for (int64_t c = 0; c < C; ++c)
        l += double(m.x.f[size_t(n * C + c)]) * m.Wr.f[size_t(e * C + c)];
      p[size_t(e)] = l;
      mx = std::max(mx, l);
    }
    for (auto& v : p) s += (v = std::exp(v - mx));
    for (auto& v : p) v /= s;
    std::vector<int> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
    double ws = 0;
    for (int64_t k = 0; k < K; ++k) ws += p[size_t(order[size_t(k)])];
    for (int64_t k = 0; k < K; ++k) {
      idx[size_t(n * K + k)] = order[size_t(k)];
      wts[size_t(n * K + k)] = p[size_t(order[size_t(k)])] / ws;
    }
  }
  std::vector<char> kept = ref_admit(idx, N, K, E, m.capacity);
  *kept_out = std::count(kept.begin(), kept.end(), 1);
  std::vector<double> y(size_t(N * C), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      if (!kept[size_t(n * K + k)]) continue;
      const int64_t e = idx[size_t(n * K + k)];
      std::vector<double> a(static_cast<size_t>(H));
      for (int64_t h = 0; h < H; ++h) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < C; ++c) {
          double xv = m.x.f[size_t(n * C + c)];
          g += xv * m.Wg.f[size_t((e * H + h) * C + c)];
          u += xv * m.Wu.f[size_t((e * H + h) * C + c)];
        }
        a[size_t(h)] = silu(g) * u;
      }
      for (int64_t c = 0; c < C; ++c) {
        double o = 0;
        for (int64_t h = 0; h < H; ++h) o += a[size_t(h)] * m.Wd.f[size_t((e * C + c) * H + h)];
        y[size_t(n * C + c)] += wts[size_t(n * K + k)] * o;
      }
    }
  return y;
}

}  // namespace

TEST_CASE("MoE FFN through the ops matches a naive per-token loop", "[moe][composite]") {
  // capacity 0: dropless. capacity 4 = ceil(0.5 * N*K / E) with N*K/E = 8:
  // about half the assignments are dropped.
  for (int cap : {0, 4}) {
    MoeFfn m(cap, 0.f, 91);
    m.forward();
    int64_t kept_ref = 0;
    std::vector<double> ref = naive_moe(m, &kept_ref);
    REQUIRE(m.offsets.i[MoeFfn::E] == kept_ref);
    if (cap == 0)
      REQUIRE(kept_ref == MoeFfn::N * MoeFfn::K);
    else
      REQUIRE(kept_ref < MoeFfn::N * MoeFfn::K);
    double err = max_rel_diff(m.y.p(), ref.data(), ref.size(), 1e-2);
    std::printf("[composite] moe ffn capacity=%d kept=%lld/%lld rel=%.3e\n", cap,
                (long long)kept_ref, (long long)(MoeFfn::N * MoeFfn::K), err);
    REQUIRE(err < 1e-5);
    if (cap > 0) {
      int64_t fully_dropped = 0;
      for (int64_t n = 0; n < MoeFfn::N; ++n) {
        bool any = false;
        for (int64_t k = 0; k < MoeFfn::K; ++k) any |= m.row_map.i[size_t(n * MoeFfn::K + k)] >= 0;
        if (any) continue;
        ++fully_dropped;
        REQUIRE(all_zero(m.y.p() + n * MoeFfn::C, size_t(MoeFfn::C)));
      }
      std::printf("[composite] tokens with every choice dropped: %lld\n", (long long)fully_dropped);
      REQUIRE(fully_dropped > 0);
    }
  }
}

TEST_CASE("MoE FFN backward through the ops matches finite differences",
          "[moe][composite][gradcheck]") {
  for (int cap : {0, 4}) {
    MoeFfn m(cap, 0.5f, 101);
    m.loss();
    const std::vector<int32_t> base_idx = m.idx.i, base_map = m.row_map.i;
    if (cap > 0) REQUIRE(m.offsets.i[MoeFfn::E] < MoeFfn::N * MoeFfn::K);
    m.backward();
    bool routing_changed = false;
    auto loss = [&]() {
      double L = m.loss();
      if (m.idx.i != base_idx || m.row_map.i != base_map) routing_changed = true;
      return L;
    };
    const std::vector<float> a_dx = m.dx.f, a_dWr = m.dWr.f, a_dWg = m.dWg.f, a_dWu = m.dWu.f,
                             a_dWd = m.dWd.f;
    const std::string tag = cap > 0 ? " (capacity 4)" : " (dropless)";
    const double tol = 1e-2;
    GradCheckResult r[5] = {grad_check("moe ffn dx" + tag, m.x.f, a_dx, loss),
                            grad_check("moe ffn dW_router" + tag, m.Wr.f, a_dWr, loss),
                            grad_check("moe ffn dW_gate" + tag, m.Wg.f, a_dWg, loss),
                            grad_check("moe ffn dW_up" + tag, m.Wu.f, a_dWu, loss),
                            grad_check("moe ffn dW_down" + tag, m.Wd.f, a_dWd, loss)};
    REQUIRE_FALSE(routing_changed);
    for (const auto& ri : r) REQUIRE(ri.max_rel_err < tol);
  }
}

TEST_CASE("MoE ops on inputs large enough to run threaded", "[moe]") {
  // The small cases above stay under the OpenMP thresholds; this one does
  // not, and must give the same answers as the plain loops.
  const int64_t N = 6000, E = 4, K = 2, C = 16;
  Owned logits({N, E}), probs({N, E}), idx({N, K}, DType::I32), w({N, K}),
      row_map({N, K}, DType::I32), offsets({E + 1}, DType::I32), x({N, C}), xp({N * K, C}),
      y({N, C});
  fill_normal(logits.f, 111, 2.f);
  fill_normal(x.f, 112);
  cpu::moe_route_forward(probs, idx, w, logits, true);
  RefRoute r = ref_route(logits.f, N, E, K, true);
  REQUIRE(max_rel_diff(w.p(), r.w.data(), r.w.size()) < 1e-6);
  for (size_t i = 0; i < r.idx.size(); ++i) REQUIRE(idx.i[i] == r.idx[i]);
  cpu::moe_dispatch_plan(row_map, offsets, idx, int(E), int(N * K / E / 2), {});
  const int64_t kept = offsets.i[E];
  REQUIRE(kept < N * K);
  cpu::moe_permute(xp, x, row_map);
  cpu::moe_unpermute(y, xp, row_map, w);
  // unpermute(permute(x)) = x * (sum of kept weights) per token.
  double m = 0;
  for (int64_t n = 0; n < N; ++n) {
    double ws = 0;
    for (int64_t k = 0; k < K; ++k)
      if (row_map.i[size_t(n * K + k)] >= 0) ws += w.f[size_t(n * K + k)];
    for (int64_t c = 0; c < C; ++c)
      m = std::max(m, std::fabs(y.f[size_t(n * C + c)] - ws * x.f[size_t(n * C + c)]));
  }
  REQUIRE(m < 1e-5);
  REQUIRE(all_zero(xp.p() + kept * C, size_t((N * K - kept) * C)));
}
