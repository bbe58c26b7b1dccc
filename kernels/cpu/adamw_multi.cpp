// Multi-tensor AdamW of the CPU backend (kernels/op_list.h): the list in
// order, each tensor through the single-tensor update (which threads over its
// elements), so the results are those of adamw_update / adamw_update_master
// call by call.
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace trainer::cpu {

void adamw_update_master_multi(const std::vector<Tensor>& params,
                               const std::vector<Tensor>& masters,
                               const std::vector<Tensor>& grads, const std::vector<Tensor>& ms,
                               const std::vector<Tensor>& vs,
                               const std::vector<float>& weight_decays, const AdamWStep& s) {
  for (size_t i = 0; i < masters.size(); ++i) {
    if (masters[i].numel() == 0) continue;
    AdamWStep one = s;
    one.weight_decay = weight_decays[i];
    if (params[i].data == masters[i].data)
      cpu::adamw_update(masters[i], grads[i], ms[i], vs[i], one);
    else
      cpu::adamw_update_master(params[i], masters[i], grads[i], ms[i], vs[i], one);
  }
}

}  // namespace trainer::cpu
