// MoE router and dispatch plan, CPU reference (math in docs/MODEL_MATH.md,
// "Mixture of experts"). Per-row work is tiny (E is tens to hundreds), so the
// row loops run in double for an accurate reference and parallelize over tokens.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/f32.h"

namespace trainer::cpu {
namespace {

using checks::fail;

// Expert ids come from another op or another rank (EP); a bad one would
// index out of bounds silently, so every consumer checks them.
void check_expert_ids(const char* op, const Tensor& topk_idx, int64_t E) {
  const int32_t* idx = topk_idx.i32();
  const int64_t K = topk_idx.dim(1);
  for (int64_t i = 0; i < topk_idx.numel(); ++i)
    if (idx[i] < 0 || idx[i] >= E)
      fail(op, "topk_idx[" + std::to_string(i / K) + "," + std::to_string(i % K) +
                   "] = " + std::to_string(idx[i]) + " is outside [0, " + std::to_string(E) + ")");
}

// The admission already decided for an assignment: absent means every
// assignment is a candidate.
bool candidate(const int32_t* admitted, int64_t i) { return admitted == nullptr || admitted[i] >= 0; }

}  // namespace

void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits,
                       bool normalize) {
  const char* op = "moe_route_forward";
  need_f32(op, {{"logits", &logits}});
  const int64_t N = logits.dim(0), E = logits.dim(1), K = topk_idx.dim(1);

  const float* L = logits.f32();
  float* P = probs.f32();
  int32_t* I = topk_idx.i32();
  float* W = topk_w.f32();
#pragma omp parallel for if (N * E > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    // Computed into a local row first so that probs may alias logits.
    std::vector<double> p(static_cast<size_t>(E));
    const float* l = L + n * E;
    double mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = std::fmax(mx, double(l[e]));
    double s = 0;
    for (int64_t e = 0; e < E; ++e) s += (p[size_t(e)] = std::exp(double(l[e]) - mx));
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] /= s;
      P[n * E + e] = float(p[size_t(e)]);
    }
    // Ties are broken by the stored fp32 probabilities so that a backend
    // that only has the fp32 row picks the same experts. The scan runs in
    // ascending index with a strict '>', which keeps the lower index on a
    // tie and never reads outside the row even if a probability is NaN.
    std::vector<char> taken(size_t(E), 0);
    double wsum = 0;
    for (int64_t k = 0; k < K; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (taken[size_t(e)]) continue;
        if (best < 0 || P[n * E + e] > P[n * E + best]) best = e;
      }
      taken[size_t(best)] = 1;
      I[n * K + k] = int32_t(best);
      wsum += P[n * E + best];
    }
    for (int64_t k = 0; k < K; ++k) {
      double w = P[n * E + I[n * K + k]];
      W[n * K + k] = float(normalize ? w / wsum : w);
    }
  }
}

void moe_router_stats(Tensor stats, Tensor probs, Tensor topk_idx) {
  const char* op = "moe_router_stats";
  const int64_t N = probs.dim(0), E = probs.dim(1);
  check_expert_ids(op, topk_idx, E);
  float* S = stats.f32();
  const int32_t* idx = topk_idx.i32();
  // Counts before any capacity drop: the aux loss balances what the router
  // asks for, not what the capacity let through.
  std::vector<int64_t> count(size_t(E), 0);
  for (int64_t i = 0; i < topk_idx.numel(); ++i) ++count[size_t(idx[i])];
  // Row by row (contiguous reads); each column still sums its tokens in order.
  const float* P = probs.f32();
  std::vector<double> pe(size_t(E), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) pe[size_t(e)] += P[n * E + e];
  for (int64_t e = 0; e < E; ++e) {
    S[e] = float(count[size_t(e)]);
    S[E + e] = float(pe[size_t(e)]);
  }
}

void moe_aux_loss_forward(Tensor aux, Tensor stats, int tokens, int topk) {
  const int64_t E = stats.dim(1);
  const float* S = stats.f32();
  if (tokens == 0) {
    aux.f32()[0] = 0.f;
    return;
  }
  const double NK = double(tokens) * double(topk);
  double total = 0;
  for (int64_t e = 0; e < E; ++e) total += (double(S[e]) / NK) * (double(S[E + e]) / double(tokens));
  aux.f32()[0] = float(double(E) * total);
}

void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx,
                        Tensor topk_w, bool normalize, float aux_grad, Tensor stats, int tokens) {
  const char* op = "moe_route_backward";
  need_f32(op, {{"dlogits", &dlogits}});
  // An absent dtopk_w: only the aux loss drives the router.
  const bool have_dw = !dtopk_w.empty();
  const int64_t N = probs.dim(0), E = probs.dim(1), K = topk_idx.dim(1);
  check_expert_ids(op, topk_idx, E);
  if (N == 0) return;

  // d aux / d probs[n,e] = E * f_e / tokens, the same for every token; the
  // statistics may cover more tokens than this rank's N (a split sequence).
  std::vector<double> daux(size_t(E), 0.0);
  if (aux_grad != 0.f && tokens > 0) {
    const double NK = double(tokens) * double(K);
    const float* S = stats.f32();
    for (int64_t e = 0; e < E; ++e)
      daux[size_t(e)] = double(aux_grad) * double(E) * (double(S[e]) / NK) / double(tokens);
  }

  const float* P = probs.f32();
  const int32_t* I = topk_idx.i32();
  const float* W = topk_w.f32();
  const float* DW = have_dw ? dtopk_w.f32() : nullptr;
  float* DL = dlogits.f32();
#pragma omp parallel for if (N * E > (1 << 14))
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> dp(daux);
    if (have_dw) {
      const float* p = P + n * E;
      const int32_t* idx = I + n * K;
      const float* dw = DW + n * K;
      if (normalize) {
        // w_k = p_k / S with S = sum_j p_j over the selected experts:
        // d w_k / d p_j = (delta_kj - w_k) / S, so
        // dp_j = (dw_j - sum_k dw_k w_k) / S.
        double S = 0, dot = 0;
        for (int64_t k = 0; k < K; ++k) {
          S += p[idx[k]];
          dot += double(dw[k]) * double(W[n * K + k]);
        }
        for (int64_t k = 0; k < K; ++k) dp[size_t(idx[k])] += (double(dw[k]) - dot) / S;
      } else {
        for (int64_t k = 0; k < K; ++k) dp[size_t(idx[k])] += dw[k];
      }
    }
    // Softmax backward: dl_e = p_e (dp_e - sum_j p_j dp_j).
    double dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += double(P[n * E + e]) * dp[size_t(e)];
    for (int64_t e = 0; e < E; ++e)
      DL[n * E + e] = float(double(P[n * E + e]) * (dp[size_t(e)] - dot));
  }
}

void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts,
                       int capacity, Tensor admitted) {
  const char* op = "moe_dispatch_plan";
  const int64_t E = num_experts, N = topk_idx.dim(0), K = topk_idx.dim(1);
  check_expert_ids(op, topk_idx, E);

  const int32_t* I = topk_idx.i32();
  const int32_t* A = admitted.empty() ? nullptr : admitted.i32();
  int32_t* R = row_map.i32();
  int32_t* O = offsets.i32();
  // Pass 1 admits in priority order (k-major, then token) and records each
  // kept assignment's slot within its expert; the expert's base row is only
  // known once every expert's count is final, hence pass 2. Within an expert
  // rows therefore follow admission order: all first choices by token, then
  // all second choices by token, and so on.
  std::vector<int64_t> count(size_t(E), 0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const int32_t e = I[n * K + k];
      if (candidate(A, n * K + k) && (capacity <= 0 || count[size_t(e)] < capacity))
        R[n * K + k] = int32_t(count[size_t(e)]++);
      else
        R[n * K + k] = -1;
    }
  O[0] = 0;
  for (int64_t e = 0; e < E; ++e) O[e + 1] = int32_t(O[e] + count[size_t(e)]);
  for (int64_t i = 0; i < N * K; ++i)
    if (R[i] >= 0) R[i] += O[I[i]];
}

}  // namespace trainer::cpu
