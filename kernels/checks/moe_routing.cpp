// Shared checks of the MoE router and dispatch plan (kernels/op_list.h).
// Expert ids are values: the CPU checks them on the host, CUDA poisons what a
// bad one touches (kernels/cuda/moe_routing.cu).
#include <climits>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// Present, of dtype dt (float_any: any float storage type), exactly ndim dims.
void need_nd(const char* op, const char* name, const Tensor& t, DType dt, int ndim,
             bool float_any = false) {
  if (float_any)
    need_float(op, name, t);
  else
    need(op, name, t, dt);
  need_ndim(op, name, t, ndim);
}

void rows_of(const char* op, const char* name, const Tensor& t, int64_t N, const char* ref_name,
             const Tensor& ref) {
  if (t.dim(0) != N)
    fail(op, std::string(name) + " " + t.shape_str() + " must have N = " + std::to_string(N) +
                 " rows (" + ref_name + " " + ref.shape_str() + ")");
}

}  // namespace

void moe_route_forward(Tensor probs, Tensor topk_idx, Tensor topk_w, Tensor logits, bool) {
  const char* op = "moe_route_forward";
  need_nd(op, "logits", logits, DType::F32, 2, /*float_any=*/true);
  need_nd(op, "probs", probs, DType::F32, 2);
  need_nd(op, "topk_idx", topk_idx, DType::I32, 2);
  need_nd(op, "topk_w", topk_w, DType::F32, 2);
  must_match(op, "probs", probs, "logits", logits);
  must_match(op, "topk_w", topk_w, "topk_idx", topk_idx);
  const int64_t N = logits.dim(0), E = logits.dim(1), K = topk_idx.dim(1);
  rows_of(op, "topk_idx", topk_idx, N, "logits", logits);
  if (K < 1 || K > E)
    fail(op, "K = " + std::to_string(K) + " (topk_idx " + topk_idx.shape_str() +
                 ") must be in [1, E = " + std::to_string(E) + "]");
}

namespace {

// stats [2, E] F32 (the router statistics).
void need_stats(const char* op, const Tensor& stats, int64_t E) {
  need_nd(op, "stats", stats, DType::F32, 2);
  if (stats.dim(0) != 2 || stats.dim(1) != E)
    fail(op, "stats " + stats.shape_str() + " must be [2, E] = [2, " + std::to_string(E) + "]");
}

}  // namespace

void moe_router_stats(Tensor stats, Tensor probs, Tensor topk_idx) {
  const char* op = "moe_router_stats";
  need_nd(op, "probs", probs, DType::F32, 2);
  need_nd(op, "topk_idx", topk_idx, DType::I32, 2);
  rows_of(op, "topk_idx", topk_idx, probs.dim(0), "probs", probs);
  need_stats(op, stats, probs.dim(1));
}

void moe_aux_loss_forward(Tensor aux, Tensor stats, int tokens, int topk) {
  const char* op = "moe_aux_loss_forward";
  need_nd(op, "stats", stats, DType::F32, 2);
  need_stats(op, stats, stats.dim(1));
  if (aux.data == nullptr) fail(op, "aux is missing");
  if (aux.dtype != DType::F32 || aux.numel() != 1)
    fail(op, "aux " + aux.shape_str() + " " + dtype_name(aux.dtype) + " must be one F32 value");
  if (tokens < 0) fail(op, "tokens = " + std::to_string(tokens) + " must be >= 0");
  if (topk < 1) fail(op, "topk = " + std::to_string(topk) + " must be >= 1");
}

void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx,
                        Tensor topk_w, bool, float aux_grad, Tensor stats, int tokens) {
  const char* op = "moe_route_backward";
  need_nd(op, "probs", probs, DType::F32, 2);
  need_nd(op, "dlogits", dlogits, DType::F32, 2, /*float_any=*/true);
  need_nd(op, "topk_idx", topk_idx, DType::I32, 2);
  need_nd(op, "topk_w", topk_w, DType::F32, 2);
  must_match(op, "dlogits", dlogits, "probs", probs);
  must_match(op, "topk_w", topk_w, "topk_idx", topk_idx);
  // An absent dtopk_w means the combine weights received no gradient (only
  // the aux loss drives the router), which is cheaper than a zero tensor.
  if (!dtopk_w.empty()) {
    need_nd(op, "dtopk_w", dtopk_w, DType::F32, 2);
    must_match(op, "dtopk_w", dtopk_w, "topk_idx", topk_idx);
  }
  rows_of(op, "topk_idx", topk_idx, probs.dim(0), "probs", probs);
  if (aux_grad != 0.f) {
    if (stats.empty()) fail(op, "aux_grad != 0 needs the router statistics (stats is missing)");
    need_stats(op, stats, probs.dim(1));
    if (tokens < probs.dim(0))
      fail(op, "tokens = " + std::to_string(tokens) + " must count at least this rank's " +
                   std::to_string(probs.dim(0)) + " tokens (probs " + probs.shape_str() + ")");
  }
}

void moe_dispatch_plan(Tensor row_map, Tensor offsets, Tensor topk_idx, int num_experts, int,
                       Tensor admitted) {
  const char* op = "moe_dispatch_plan";
  need_nd(op, "topk_idx", topk_idx, DType::I32, 2);
  need_nd(op, "row_map", row_map, DType::I32, 2);
  need_nd(op, "offsets", offsets, DType::I32, 1);
  must_match(op, "row_map", row_map, "topk_idx", topk_idx);
  if (!admitted.empty()) {
    need_nd(op, "admitted", admitted, DType::I32, 2);
    must_match(op, "admitted", admitted, "topk_idx", topk_idx);
  }
  if (num_experts < 1) fail(op, "num_experts = " + std::to_string(num_experts) + " must be >= 1");
  const int64_t E = num_experts, N = topk_idx.dim(0), K = topk_idx.dim(1);
  if (offsets.dim(0) != E + 1)
    fail(op, "offsets " + offsets.shape_str() + " must be [E+1] = [" + std::to_string(E + 1) + "]");
  // Rows are stored as I32; the buffer must stay addressable.
  if (N * K > INT32_MAX)
    fail(op, "N*K = " + std::to_string(N * K) + " rows do not fit in I32 (topk_idx " +
                 topk_idx.shape_str() + ")");
}

}  // namespace trainer::op_checks
