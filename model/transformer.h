// The whole decoder-only model: embedding, L blocks (attention + dense or MoE
// FFN), final norm, head and fused cross-entropy. Holds the buffers of one
// model replica; the math lives in the block files and kernels/ops.h.
#pragma once

#include <vector>

#include "core/arena.h"
#include "model/activations.h"
#include "model/dims.h"
#include "model/params.h"
#include "model/sharding.h"
#include "model/units.h"

namespace trainer {

class UnitHooks;

struct Model {
  ModelDims dims;                    // this rank's (local) sizes
  std::vector<ParamInfo> params;     // this rank's slices, in unit order
  std::vector<UnitLayout> units;     // from the sharding plan
  UnitIndex unit_index;
  Arena param_arena, grad_arena, act_arena, scratch_arena;
  std::vector<Tensor> param_tensors, grad_tensors;
  Weights w, gw;
  Activations acts;
  GradScratch g;
  // Called at unit boundaries (model/units.h); null for a plain replica.
  UnitHooks* hooks = nullptr;
};

// How ZeRO (optim/zero.h) tells model code where weights and gradients come
// from without the layers knowing: before a unit's weights are read the hook
// may gather them and rebind m.w; before a unit's gradients are written it may
// bind m.gw to a fresh buffer, and after backward finished them it may start
// their reduction. The head unit also uses the embedding's weights and
// gradients when they are tied.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void forward_begin(Model& m, int unit) = 0;
  virtual void backward_begin(Model& m, int unit) = 0;
  virtual void backward_end(Model& m, int unit) = 0;
};

// Where parameters and gradients live. The default is a full replica: both
// arenas hold every tensor (units padded as the plan says). ZeRO-2/3 keep
// only shards and bind m.w / m.gw unit by unit through hooks, so the arenas
// they do not own stay empty and the tensors unbound (data == nullptr) until
// then.
struct ModelStorage {
  bool full_params = true;
  bool full_grads = true;
};

// The model as the sharding plan lays it out for this rank.
void build_model(Model& m, const ShardingPlan& plan, Device device, const ModelStorage& storage = {});
// One process, no parallelism (tests, tools): the plan of a single replica.
void build_model(Model& m, const ModelDims& d, double init_std, Device device, const ModelStorage& storage = {});

struct ForwardResult {
  double loss_sum = 0;   // sum over the micro-batch's tokens of the cross-entropy
  double aux_sum = 0;    // sum over MoE layers of the load-balancing loss
};

// Reads m.acts.ids / m.acts.targets. With ce_grad_scale > 0 the logits are
// overwritten with their gradient (scaled), ready for model_backward.
ForwardResult model_forward(Model& m, float ce_grad_scale);
// Accumulates parameter gradients into m.gw. aux_grad = d loss / d aux (per layer).
void model_backward(Model& m, float aux_grad);
void zero_grads(Model& m);

}  // namespace trainer
