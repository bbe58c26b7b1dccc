#include "model/recompute.h"

#include <set>

#include "kernels/ops.h"
#include "model/expert_parallel.h"
#include "model/layers.h"

namespace trainer {

const char* recompute_name(Recompute mode) {
  switch (mode) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

bool recomputed_field(Recompute mode, const std::string& field) {
  // A split backward's stash is written by the backward itself; zb-h1 with
  // recompute is refused (config_validate.cpp), the stash always stays.
  if (mode == Recompute::None || field.rfind("stash.", 0) == 0) return false;
  if (mode == Recompute::Full) return field != "x_in";
  static const std::set<std::string> selective = {"h1", "o", "lse", "h2", "act", "eact"};
  return selective.count(field) > 0;
}

namespace {

void recompute_selective(const ModelDims& d, bool moe, const ContextParallel& cp,
                         const LayerWeights& w, LayerActs& a) {
  // The same calls, on the same inputs, as the block forwards
  // (attention_block.cpp, mlp_block.cpp, moe_block.cpp).
  // The norm outputs at this rank's rows, as the slot would have kept them
  // (the backward gathers them under sp).
  norm_forward(d, a.h1, a.mean1, a.rstd1, a.x_in, w.attn_norm_w, w.attn_norm_b);
  const Tensor docs = d.documents ? a.doc_start.view({d.B, d.T}) : Tensor{};
  if (d.cp > 1)
    ring_attention_forward(cp, a.o.view({d.B, d.T, d.Hq, d.D}), a.lse, a.q, a.k, a.v, d.window, docs);
  else
    ops::attention_forward(a.o.view({d.B, d.T, d.Hq, d.D}), a.lse, a.q, a.k, a.v, true, d.window, docs);
  norm_forward(d, a.h2, a.mean2, a.rstd2, a.x_mid, w.mlp_norm_w, w.mlp_norm_b);
  if (moe) {
    const int64_t R = expert_rows_used(d, a);
    if (R <= 0) return;
    if (d.llama)
      ops::swiglu_forward(a.eact.slice0(0, R), a.e1.slice0(0, R), a.e2.slice0(0, R));
    else
      ops::gelu_forward(a.eact.slice0(0, R), a.e1.slice0(0, R));
  } else if (d.llama) {
    ops::swiglu_forward(a.act, a.a1, a.a2);
  } else {
    ops::gelu_forward(a.act, a.a1);
  }
}

}  // namespace

void recompute_layer(const ModelDims& d, Recompute mode, bool moe, const TensorParallel& tp,
                     const ContextParallel& cp, Communicator& ep, const LayerWeights& w, LayerActs& a, Tensor moe_out,
                     Tensor scratch) {
  if (mode == Recompute::Selective) return recompute_selective(d, moe, cp, w, a);
  if (mode != Recompute::Full) return;
  attention_block_forward(d, tp, cp, w, a, a.x_mid);
  const Tensor x_out = scratch.view({d.N(), d.C}).slice0(0, d.rows());
  if (moe)
    moe_block_forward(d, tp, cp, ep, w, a, moe_out, x_out);
  else
    mlp_block_forward(d, tp, w, a, x_out);
}

}  // namespace trainer
