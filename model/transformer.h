// The decoder-only model as one rank holds it (model/sharding.h): for a
// pipeline stage its layers, with the embedding on the first stage and the
// final norm, head and fused cross-entropy on the last. The math lives in the
// block files and kernels/ops.h.
//
// Execution is stage-shaped: forward and backward are callable per piece
// (embedding, a range of blocks, head + loss) and per micro-batch, so a
// pipeline schedule can interleave micro-batches (1F1B runs backward k while
// forward k + p is in flight). Each micro-batch in flight keeps its saved
// activations in an activation slot, acquired by id and released after its
// backward; the pool is sized by the schedule (reserve_activation_slots).
// The gradient of the residual stream at the stage's boundary lives in the
// slot too (activation_grad): the next stage's (or the head's) gradient is
// written there, and blocks_backward leaves the gradient at the stage input.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/activations.h"
#include "model/dims.h"
#include "model/params.h"
#include "model/sharding.h"
#include "model/units.h"

namespace trainer {

class UnitHooks;
struct ExpertLoad;

// One slot of saved activations: the micro-batch it holds (-1: free), its
// buffers and the residual-stream gradient at the stage boundary [N, C].
struct ActivationSlot {
  int64_t mb = -1;
  Arena arena;
  Activations acts;
  Tensor dx;
};

struct Model {
  ModelDims dims;                    // this rank's (local) sizes
  std::vector<ParamInfo> params;     // this rank's slices, in unit order
  std::vector<ParamPlacement> placement;  // parallel to params (model/sharding.h)
  std::vector<UnitLayout> units;     // from the sharding plan
  UnitIndex unit_index;
  Arena param_arena, grad_arena, scratch_arena;
  std::vector<Tensor> param_tensors, grad_tensors;
  Weights w, gw;
  std::vector<std::unique_ptr<ActivationSlot>> slots;
  Activations acts;                  // slot 0's activations (one micro-batch at a time)
  GradScratch g;                     // backward scratch, reused layer after layer
  // Tensor-parallel group (a group of one by default); its size must be the
  // plan's tp (model/tensor_parallel.h).
  Communicator* tp = nullptr;
  // Expert-parallel group (model/expert_parallel.h); its size must be the plan's ep.
  Communicator* ep = nullptr;
  // Context-parallel group (model/context_parallel.h); its size must be the plan's cp.
  Communicator* cp = nullptr;
  // The ring passes the next key/value block while it computes on this one
  // (parallel.overlap); false: each pass is waited for first.
  bool overlap_comm = true;
  // When set, every MoE layer's forward adds its routing (model/expert_load.h).
  ExpertLoad* expert_load = nullptr;
  // Called at unit boundaries (model/units.h); null for a plain replica.
  UnitHooks* hooks = nullptr;
};

// A micro-batch as the schedule sees it: its id (which activation slot) and
// whether its backward is this stage's last of the step (gradients are then
// complete and may be reduced). The schedule says which one is last, not
// the order of calls.
struct MicroBatch {
  int64_t id = 0;
  bool last = true;
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
  virtual void forward_begin(Model& m, int unit, const MicroBatch& mb) = 0;
  virtual void backward_begin(Model& m, int unit, const MicroBatch& mb) = 0;
  virtual void backward_end(Model& m, int unit, const MicroBatch& mb) = 0;
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

// The model as the sharding plan lays it out for this rank, with one
// activation slot.
void build_model(Model& m, const ShardingPlan& plan, Device device, const ModelStorage& storage = {});
// One process, no parallelism (tests, tools): the plan of a single replica.
void build_model(Model& m, const ModelDims& d, double init_std, Device device, const ModelStorage& storage = {});

// The device the model's buffers live on.
Device model_device(const Model& m);

// ---- activation slots ------------------------------------------------------
// Room for n micro-batches in flight (the schedule's maximum).
void reserve_activation_slots(Model& m, int n);
// The slot of micro-batch `mb`: the one it holds, else a free one (throws
// when all are taken: the schedule has more in flight than reserved).
Activations& acquire_activations(Model& m, int64_t mb);
Activations& activations_of(Model& m, int64_t mb);  // must be held
void release_activations(Model& m, int64_t mb);
// The stage's input (the first layer's residual) and output, and the
// residual gradient at the boundary, of a held micro-batch.
Tensor stage_input(Model& m, int64_t mb);
Tensor stage_output(Model& m, int64_t mb);
Tensor activation_grad(Model& m, int64_t mb);

struct ForwardResult {
  double loss_sum = 0;   // sum over the micro-batch's tokens of the cross-entropy
  double aux_sum = 0;    // sum over MoE layers of the load-balancing loss
};

// ---- pieces (one micro-batch each; its activations must be held) ---------
// ids -> the first layer's input (first stage).
void embedding_forward(Model& m, const MicroBatch& mb);
// Local layers [first, first + count): their input to their output; returns
// the sum of their load-balancing losses.
double blocks_forward(Model& m, const MicroBatch& mb, int64_t first, int64_t count);
// Final norm, head, cross-entropy (last stage). With ce_grad_scale > 0 the
// logits are overwritten with their gradient (scaled), ready for head_backward.
ForwardResult head_forward(Model& m, const MicroBatch& mb, float ce_grad_scale);
// Logit gradient -> activation_grad (the residual gradient at the head's input).
void head_backward(Model& m, const MicroBatch& mb, BackwardPart part = BackwardPart::Whole);
// activation_grad at the output of layer first + count - 1 -> at the input of
// layer `first`; accumulates the layers' parameter gradients.
void blocks_backward(Model& m, const MicroBatch& mb, int64_t first, int64_t count, float aux_grad,
                     BackwardPart part = BackwardPart::Whole);
// activation_grad at the first layer's input -> the embedding's gradients.
// (The embedding has no input gradient: its backward is all weight half.)
void embedding_backward(Model& m, const MicroBatch& mb);

// A split backward (zero-bubble schedules; the model built with
// ModelDims::split_backward): head_backward and blocks_backward with
// BackwardPart::Input compute the input gradients (and the norms' weight
// gradients), keeping the linears' output gradients in the slot; these
// compute the matrix and bias gradients from them later and end each
// unit's backward for the hooks. The slot must be held until then.
void head_backward_weight(Model& m, const MicroBatch& mb);
void blocks_backward_weight(Model& m, const MicroBatch& mb, int64_t first, int64_t count);

// ---- the whole instance, one micro-batch -----------------------------------
// Every piece this instance holds in order. Reads the slot's ids / targets.
// A forward without a gradient scale (evaluation, sampling) releases the
// slot again; its outputs stay readable until the next forward.
ForwardResult model_forward(Model& m, float ce_grad_scale, const MicroBatch& mb = {});
// Accumulates parameter gradients into m.gw, then releases the slot.
// aux_grad = d loss / d aux (per layer).
void model_backward(Model& m, float aux_grad, const MicroBatch& mb = {});
void zero_grads(Model& m);

}  // namespace trainer
