// Shared checks of the MoE permutation ops (kernels/op_list.h). The row map's
// values are the backends' business: the CPU validates them on the host, CUDA
// skips entries outside [-1, N*K).
#include <climits>
#include <string>

#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {
namespace {

using namespace checks;

// Token-side [N,C] and expert-side [N*K,C] float tensors against row_map [N,K].
void check_layout(const char* op, const char* tok_name, const Tensor& tok, const char* perm_name,
                  const Tensor& perm, const Tensor& row_map) {
  need(op, "row_map", row_map, DType::I32);
  need_ndim(op, "row_map", row_map, 2);
  need_float(op, tok_name, tok);
  need_ndim(op, tok_name, tok, 2);
  need_float(op, perm_name, perm);
  need_ndim(op, perm_name, perm, 2);
  const int64_t N = row_map.dim(0), K = row_map.dim(1), C = tok.dim(1);
  if (tok.dim(0) != N || perm.dim(0) != N * K || perm.dim(1) != C)
    fail(op, std::string(tok_name) + " " + tok.shape_str() + " and " + perm_name + " " +
                 perm.shape_str() + " must be [N, C] and [N*K, C] for row_map " +
                 row_map.shape_str());
  if (N * K > INT32_MAX)
    fail(op, "row_map " + row_map.shape_str() + " has more than 2^31 - 1 rows");
}

// Combine weights: F32 [N,K] like row_map.
void check_weights(const char* op, const char* name, const Tensor& w, const Tensor& row_map) {
  need(op, name, w, DType::F32);
  need_ndim(op, name, w, 2);
  must_match(op, name, w, "row_map", row_map);
}

}  // namespace

void moe_permute(Tensor xp, Tensor x, Tensor row_map) {
  check_layout("moe_permute", "x", x, "xp", xp, row_map);
}

void moe_permute_backward(Tensor dx, Tensor dxp, Tensor row_map) {
  check_layout("moe_permute_backward", "dx", dx, "dxp", dxp, row_map);
}

void moe_unpermute(Tensor y, Tensor yp, Tensor row_map, Tensor topk_w) {
  check_layout("moe_unpermute", "y", y, "yp", yp, row_map);
  check_weights("moe_unpermute", "topk_w", topk_w, row_map);
}

void moe_unpermute_backward(Tensor dyp, Tensor dtopk_w, Tensor dy, Tensor yp, Tensor row_map,
                            Tensor topk_w) {
  const char* op = "moe_unpermute_backward";
  check_layout(op, "dy", dy, "dyp", dyp, row_map);
  check_layout(op, "dy", dy, "yp", yp, row_map);
  check_weights(op, "topk_w", topk_w, row_map);
  // dtopk_w may be absent when the router is not being trained.
  if (!dtopk_w.empty()) check_weights(op, "dtopk_w", dtopk_w, row_map);
}

}  // namespace trainer::op_checks
