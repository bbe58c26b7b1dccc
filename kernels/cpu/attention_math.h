// The arithmetic of a block of query rows that attention.cpp (the whole
// sequence) and attention_positions.cpp (explicit positions, ring attention)
// share: the block's sgemms, a row's softmax forward and backward and the
// backward's delta. Both files run the very same operations on a row, which
// is why attention_forward_pos with identity positions gives the bits of
// attention_forward(causal).
//
// A block is `rows` query rows against `keys` consecutive keys; its scores
// sit in a rows x keys row-major scratch. Row r sees the keys [a, a + n) of
// the block (the caller works out which); everything outside them is zeroed,
// so the block's sgemms may run over all `keys`.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/row_math.h"

namespace trainer::cpu::attention_math {

// Query rows per block: each block's scores are one kBlock x keys sgemm.
constexpr int64_t kBlock = 64;

// S = alpha A B^T: the block's rows x keys scores from A (rows x D, row
// stride lda) and B (keys x D, row stride ldb).
inline void block_scores(int64_t rows, int64_t keys, int64_t D, float alpha, const float* A,
                         int64_t lda, const float* B, int64_t ldb, float* S) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(keys), int(D), alpha, A,
              int(lda), B, int(ldb), 0.f, S, int(keys));
}

// C = alpha S X + beta C: rows x D from the block's S (rows x keys) and X
// (keys x D): the output P V, or dQ = scale dS K.
inline void block_times_keys(int64_t rows, int64_t D, int64_t keys, float alpha, const float* S,
                             const float* X, int64_t ldx, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(D), int(keys), alpha, S,
              int(keys), X, int(ldx), beta, C, int(ldc));
}

// C += alpha S^T X: keys x D from the block's S (rows x keys) and X (rows x
// D): dK += scale dS^T Q, dV += P^T dO.
inline void block_add_transposed(int64_t keys, int64_t D, int64_t rows, float alpha,
                                 const float* S, const float* X, int64_t ldx, float* C,
                                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(keys), int(D), int(rows), alpha, S,
              int(keys), X, int(ldx), 1.f, C, int(ldc));
}

// One block row of `keys` scores whose keys [a, a + n) are seen (n >= 1;
// masked keys inside already -inf): the seen scores become probabilities,
// the rest 0; returns the row's log-sum-exp.
inline float softmax_row(float* row, int64_t keys, int64_t a, int64_t n) {
  float* x = row + a;
  const float mx = row_max(x, n);
  const double sum = exp_sum_into(x, x, n, mx);
  const float inv = float(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) x[j] *= inv;
  std::fill(row, x, 0.f);
  std::fill(x + n, row + keys, 0.f);
  return float(double(mx) + std::log(sum));
}

// The backward of one block row: its scores p and dP = dO V^T d over the
// seen keys [a, a + n) become P and dS = P (dP - delta) (softmax_grad_row,
// from the forward's lse), the rest of both rows 0.
inline void softmax_grad_block_row(float* p, float* d, int64_t keys, int64_t a, int64_t n,
                                   float lse, float delta) {
  softmax_grad_row(p + a, d + a, n, lse, delta);
  std::fill(p, p + a, 0.f);
  std::fill(p + a + n, p + keys, 0.f);
  std::fill(d, d + a, 0.f);
  std::fill(d + a + n, d + keys, 0.f);
}

// delta_r = sum_j P_rj dP_rj = dO_r . O_r (the softmax Jacobian term) of the
// block's rows, dO and O with row stride ld.
inline void row_deltas(float* delta, int64_t rows, const float* dO, const float* O, int64_t ld,
                       int64_t D) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* o = O + r * ld;
    const float* go = dO + r * ld;
    delta[r] = float(lane_sum(D, [=](int64_t d) { return double(go[d]) * o[d]; }));
  }
}

}  // namespace trainer::cpu::attention_math
