// Shared checks of the single-tensor AdamW updates (kernels/op_list.h).
#include <string>

#include "kernels/checks/adamw_checks.h"
#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

using namespace checks;

void adamw::check_step(const char* op, const AdamWStep& s) {
  if (s.step < 1)
    fail(op, "step " + std::to_string(s.step) + " must be >= 1 (bias correction is 1-based)");
}

void adamw::check_master_update(const char* op, const Tensor& param, const Tensor& master,
                                const Tensor& grad, const Tensor& m, const Tensor& v) {
  need_float(op, "param", param);
  need(op, "master", master, DType::F32);
  need_float(op, "grad", grad);
  need(op, "m", m, DType::F32);
  need(op, "v", v, DType::F32);
  same_numel(op, "param", param, "master", master);
  same_numel(op, "grad", grad, "master", master);
  same_numel(op, "m", m, "master", master);
  same_numel(op, "v", v, "master", master);
  // Element i of every array is read and written by one step of one thread;
  // an overlap would feed one element's update into another's.
  if (param.data == master.data && param.dtype == DType::F32)
    disjoint(op, {{"master", &master}, {"grad", &grad}, {"m", &m}, {"v", &v}});
  else
    disjoint(op, {{"param", &param}, {"master", &master}, {"grad", &grad}, {"m", &m}, {"v", &v}});
}

void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWStep& s) {
  const char* op = "adamw_update";
  need(op, "param", param, DType::F32);
  need_float(op, "grad", grad);
  need(op, "m", m, DType::F32);
  need(op, "v", v, DType::F32);
  same_numel(op, "grad", grad, "param", param);
  same_numel(op, "m", m, "param", param);
  same_numel(op, "v", v, "param", param);
  adamw::check_step(op, s);
  disjoint(op, {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}});
}

// param may be master itself (F32): the rounding is then the identity.
void adamw_update_master(Tensor param, Tensor master, Tensor grad, Tensor m, Tensor v,
                         const AdamWStep& s) {
  adamw::check_master_update("adamw_update_master", param, master, grad, m, v);
  adamw::check_step("adamw_update_master", s);
}

}  // namespace trainer::op_checks
