#include "kernels/ops.h"
#include "model/expert_parallel.h"
#include "model/layers.h"
#include "model/moe_routing_plan.h"

namespace trainer {

// Experts see only their own rows of the permuted buffer; grouped linears keep
// every expert's matmul in one op so a GPU backend can run them as one
// grouped GEMM without reading the offsets back to the host.
//
// Under tensor parallelism every tp rank routes the whole sequence with the
// same (replicated) router, so all ranks agree on the dispatch; each expert's
// FFN is split over tp like the dense FFN (column-parallel in, row-parallel
// out), which makes the combined output a row output.
//
// Under expert parallelism (model/expert_parallel.h) the dispatched rows
// travel to the ranks holding their experts and back; the experts' side
// (xe, e1, e2, eact, ye) then holds the rows every ep rank sent here, one
// grouped-linear segment per source.
namespace {

Tensor rows(Tensor t, const ExpertSegment& s) { return t.slice0(s.begin, s.begin + s.rows); }

}  // namespace

void moe_block_forward(const ModelDims& d, const TensorParallel& tp, const ContextParallel& cp, Communicator& ep,
                       const LayerWeights& w, LayerActs& a, Tensor moe_out, Tensor x_out) {
  norm_forward(d, a.h2, a.mean2, a.rstd2, a.x_mid, w.mlp_norm_w, w.mlp_norm_b);
  const Tensor h2 = column_input(d, tp, a.h2);
  ops::linear_forward(a.rlogits, h2, w.router, {});
  ops::moe_route_forward(a.probs, a.topk_idx, a.topk_w, a.rlogits, d.normalize_topk);
  moe_route_plan(d, cp, a);
  ops::moe_permute(a.xp, h2, a.row_map);
  if (d.ep > 1) {
    ep_plan(d, ep, a);
    ep_exchange(ep, a.xe, a.ep_recv, a.xp, a.ep_send);
  }
  const std::vector<ExpertSegment> segs = expert_segments(d, a);
  const int64_t R = expert_rows_used(d, a);
  if (R > 0) {
    const auto used = [&](Tensor t) { return t.slice0(0, R); };
    if (d.llama) {
      for (const ExpertSegment& s : segs) {
        ops::grouped_linear_forward(rows(a.e1, s), rows(a.xe, s), w.e_gate, s.offsets);
        ops::grouped_linear_forward(rows(a.e2, s), rows(a.xe, s), w.e_up, s.offsets);
      }
      ops::swiglu_forward(used(a.eact), used(a.e1), used(a.e2));
      for (const ExpertSegment& s : segs)
        ops::grouped_linear_forward(rows(a.ye, s), rows(a.eact, s), w.e_down, s.offsets);
    } else {
      for (const ExpertSegment& s : segs) ops::grouped_linear_forward(rows(a.e1, s), rows(a.xe, s), w.e_fc, s.offsets);
      ops::gelu_forward(used(a.eact), used(a.e1));
      for (const ExpertSegment& s : segs)
        ops::grouped_linear_forward(rows(a.ye, s), rows(a.eact, s), w.e_proj, s.offsets);
    }
  }
  if (d.ep > 1) ep_exchange(ep, a.yp, a.ep_send, a.ye, a.ep_recv);
  // moe_out: the whole sequence's partial combine; summed into this rank's rows.
  ops::moe_unpermute(moe_out, a.yp, a.row_map, a.topk_w);
  const Tensor mine = own_rows(d, tp, moe_out);
  row_output(d, tp, mine, moe_out);
  ops::add(x_out, a.x_mid, mine);
}

void moe_block_backward(const ModelDims& d, const TensorParallel& tp, Communicator& ep, const LayerWeights& w,
                        const LayerWeights& gw, const LayerActs& a, GradScratch& g, float aux_grad, BackwardPart part) {
  const bool whole = part == BackwardPart::Whole;
  const Tensor dy = row_output_grad(d, tp, g.dres);
  WeightGradInputs in = whole ? WeightGradInputs{} : a.stash;
  if (whole) {
    in.dyp = g.dye;
    in.de1 = g.de1;
    in.de2 = g.de2;
    in.drlogits = g.drlogits;
  }
  // Input gradients (layers.h): combine -> experts -> dispatch -> d h2.
  const Tensor dyp_here = d.ep > 1 ? g.dyp : in.dyp;
  ops::moe_unpermute_backward(dyp_here, g.dtopk_w, dy, a.yp, a.row_map, a.topk_w);
  // Each rank's yp holds its part of the experts' columns: the combine
  // weights' gradient dot(dy, yp) is a partial sum too.
  sum_over_tp(tp, g.dtopk_w);
  if (d.ep > 1) ep_exchange(ep, in.dyp, a.ep_recv, dyp_here, a.ep_send);
  const std::vector<ExpertSegment> segs = expert_segments(d, a);
  const int64_t R = expert_rows_used(d, a);
  if (R > 0) {
    const auto used = [&](Tensor t) { return t.slice0(0, R); };
    if (d.llama) {
      for (const ExpertSegment& s : segs)
        ops::grouped_linear_backward(rows(g.deact, s), {}, rows(in.dyp, s), rows(a.eact, s), w.e_down, s.offsets);
      ops::swiglu_backward(used(in.de1), used(in.de2), used(g.deact), used(a.e1), used(a.e2));
      for (const ExpertSegment& s : segs) {
        ops::grouped_linear_backward(rows(g.dxe, s), {}, rows(in.de1, s), rows(a.xe, s), w.e_gate, s.offsets);
        ops::grouped_linear_backward(rows(g.dxe2, s), {}, rows(in.de2, s), rows(a.xe, s), w.e_up, s.offsets);
      }
      ops::add_inplace(used(g.dxe), used(g.dxe2));
    } else {
      for (const ExpertSegment& s : segs)
        ops::grouped_linear_backward(rows(g.deact, s), {}, rows(in.dyp, s), rows(a.eact, s), w.e_proj, s.offsets);
      ops::gelu_backward(used(in.de1), used(g.deact), used(a.e1));
      for (const ExpertSegment& s : segs)
        ops::grouped_linear_backward(rows(g.dxe, s), {}, rows(in.de1, s), rows(a.xe, s), w.e_fc, s.offsets);
    }
  }
  if (d.ep > 1) ep_exchange(ep, g.dxp, a.ep_send, g.dxe, a.ep_recv);
  ops::fill(g.dh, 0.f);
  ops::moe_permute_backward(g.dh, g.dxp, a.row_map);
  // Summed over tp before the router's part, which every tp rank computes
  // whole (for its own rows under sp).
  const Tensor dh = column_input_grad(d, tp, g.dh);
  ops::moe_route_backward(in.drlogits, g.dtopk_w, a.probs, a.topk_idx, a.topk_w, d.normalize_topk, aux_grad,
                          a.router_stats, int(routed_tokens(d)));
  ops::linear_backward(dh, {}, {}, own_rows(d, tp, in.drlogits), a.h2, w.router, true);
  if (whole) moe_block_backward_weight(d, tp, w, gw, a, in);
  norm_backward(d, g.dres, gw.mlp_norm_w, gw.mlp_norm_b, dh, a.x_mid, w.mlp_norm_w, a.mean2, a.rstd2);
}

void moe_block_backward_weight(const ModelDims& d, const TensorParallel& tp, const LayerWeights& w,
                               const LayerWeights& gw, const LayerActs& a, const WeightGradInputs& in) {
  for (const ExpertSegment& s : expert_segments(d, a)) {
    if (d.llama) {
      ops::grouped_linear_backward({}, gw.e_down, rows(in.dyp, s), rows(a.eact, s), w.e_down, s.offsets);
      ops::grouped_linear_backward({}, gw.e_gate, rows(in.de1, s), rows(a.xe, s), w.e_gate, s.offsets);
      ops::grouped_linear_backward({}, gw.e_up, rows(in.de2, s), rows(a.xe, s), w.e_up, s.offsets);
    } else {
      ops::grouped_linear_backward({}, gw.e_proj, rows(in.dyp, s), rows(a.eact, s), w.e_proj, s.offsets);
      ops::grouped_linear_backward({}, gw.e_fc, rows(in.de1, s), rows(a.xe, s), w.e_fc, s.offsets);
    }
  }
  // The replicated router's gradient from the whole sequence (gathered
  // again under sp), the same on every tp rank.
  ops::linear_backward({}, gw.router, {}, in.drlogits, column_input(d, tp, a.h2), w.router, false);
}

}  // namespace trainer
