// Shared checks of the multi-tensor AdamW update (kernels/op_list.h): each
// tensor as adamw_update_master checks it (messages name the tensor's index),
// and no array of one tensor may overlap an array of another, which the
// single-tensor op could not see: the backends update tensors concurrently.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/checks/adamw_checks.h"
#include "kernels/checks/check_util.h"
#include "kernels/checks/op_checks.h"

namespace trainer::op_checks {

using namespace checks;

void adamw_update_master_multi(const std::vector<Tensor>& params,
                               const std::vector<Tensor>& masters,
                               const std::vector<Tensor>& grads, const std::vector<Tensor>& ms,
                               const std::vector<Tensor>& vs,
                               const std::vector<float>& weight_decays, const AdamWStep& s) {
  const char* op = "adamw_update_master_multi";
  const size_t n = masters.size();
  if (params.size() != n || grads.size() != n || ms.size() != n || vs.size() != n ||
      weight_decays.size() != n)
    fail(op, "list lengths differ: params " + std::to_string(params.size()) + ", masters " +
                 std::to_string(n) + ", grads " + std::to_string(grads.size()) + ", ms " +
                 std::to_string(ms.size()) + ", vs " + std::to_string(vs.size()) +
                 ", weight_decays " + std::to_string(weight_decays.size()));
  adamw::check_step(op, s);

  struct Range {
    uintptr_t begin, end;
    size_t tensor;
    const char* name;
    const Tensor* t;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < n; ++i) {
    const std::string at = std::string(op) + ": tensor " + std::to_string(i);
    adamw::check_master_update(at.c_str(), params[i], masters[i], grads[i], ms[i], vs[i]);
    const bool param_is_master = params[i].data == masters[i].data;
    const std::pair<const char*, const Tensor*> arrays[] = {{"master", &masters[i]},
                                                            {"grad", &grads[i]},
                                                            {"m", &ms[i]},
                                                            {"v", &vs[i]},
                                                            {"param", &params[i]}};
    for (const auto& [name, t] : arrays) {
      if (t->nbytes() == 0 || (param_is_master && t == &params[i])) continue;
      const auto b = reinterpret_cast<uintptr_t>(t->data);
      ranges.push_back({b, b + t->nbytes(), i, name, t});
    }
  }
  // In address order, a range overlaps an earlier one exactly when it starts
  // before the furthest end seen so far.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  size_t furthest = 0;
  for (size_t k = 1; k < ranges.size(); ++k) {
    const Range &a = ranges[furthest], &b = ranges[k];
    if (b.begin < a.end)
      fail(op, "tensor " + std::to_string(a.tensor) + " " + a.name + " " + a.t->shape_str() +
                   " overlaps tensor " + std::to_string(b.tensor) + " " + b.name + " " +
                   b.t->shape_str());
    if (b.end > a.end) furthest = k;
  }
}

}  // namespace trainer::op_checks
