#include "model/flops.h"

namespace trainer {

double attention_core_flops(const ModelDims& d) {
  // QK^T and PV, 2 FLOPs per query-key pair and head dimension each, over
  // the pairs the mask keeps: T^2 / 2 causal, the band under a sliding window.
  return 4.0 * double(d.B) * double(d.Hq) * d.attended_pairs(d.T) * double(d.D);
}

double layer_matmul_flops(const ModelDims& d, int64_t layer) {
  const double N = double(d.N()), C = double(d.C), D = double(d.D);
  const double qkvo = 2 * N * C * D * double(2 * d.Hq + 2 * d.Hkv);
  const bool moe = d.E > 0 && (layer + 1) % d.moe_every == 0;
  const double mats = d.llama ? 3 : 2;  // SwiGLU's gate, up, down; GELU's up, down
  const double ffn = moe ? 2 * N * C * double(d.E) + double(d.K) * 2 * N * mats * C * double(d.Fm)
                         : 2 * N * mats * C * double(d.F);
  return qkvo + ffn;
}

double head_matmul_flops(const ModelDims& d) { return 2 * double(d.N()) * double(d.C) * double(d.vocab()); }

double flops_per_token(const ModelDims& d) {
  double forward = head_matmul_flops(d);
  for (int64_t i = 0; i < d.layers_total(); ++i) forward += layer_matmul_flops(d, i) + attention_core_flops(d);
  return 3 * forward / double(d.N());
}

}  // namespace trainer
