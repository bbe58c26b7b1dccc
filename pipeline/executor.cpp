#include "pipeline/executor.h"

#include <chrono>
#include <stdexcept>
#include <string>

namespace trainer {

namespace {

using clock_type = std::chrono::steady_clock;

bool holds(Model& m, int64_t mb) {
  for (const auto& s : m.slots)
    if (s->mb == mb) return true;
  return false;
}

void touch(Model& m, int64_t mb, const MicroBatchLoader& load) {
  if (holds(m, mb)) return;
  acquire_activations(m, mb);
  load(mb);
}

double forward(Model& m, int64_t mb, float ce_scale, double& loss) {
  const ModelDims& d = m.dims;
  const MicroBatch micro{mb, false};
  // Held already; again in case the loader ran a gradient-free forward of
  // its own (--dump-reference), which releases the slot it used.
  acquire_activations(m, mb);
  if (d.has_embedding) embedding_forward(m, micro);
  const double aux = blocks_forward(m, micro, 0, d.L);
  if (d.has_head) loss += head_forward(m, micro, ce_scale).loss_sum;
  return aux;
}

// The transfers actions[first, last) as one batch.
double transfer(Model& m, Communicator& pp, const std::vector<Action>& actions, size_t first, size_t last,
                const MicroBatchLoader& load) {
  std::vector<P2POp> ops;
  for (size_t i = first; i < last; ++i) {
    const Action& a = actions[i];
    if (a.chunk != 0) throw std::logic_error("pipeline executor: model chunks (interleaving) are not supported");
    switch (a.kind) {
      case ActionKind::RecvActivation:
        touch(m, a.mb, load);
        ops.push_back({false, stage_input(m, a.mb), a.peer});
        break;
      case ActionKind::SendActivation:
        ops.push_back({true, stage_output(m, a.mb), a.peer});
        break;
      case ActionKind::RecvGradient:
        ops.push_back({false, activation_grad(m, a.mb), a.peer});
        break;
      case ActionKind::SendGradient:
        ops.push_back({true, activation_grad(m, a.mb), a.peer});
        break;
      default:
        throw std::logic_error("pipeline executor: " + describe(a) + " is not a transfer");
    }
  }
  const auto t0 = clock_type::now();
  pp.batch_send_recv(ops);
  const double waited = std::chrono::duration<double>(clock_type::now() - t0).count();
  // A micro-batch whose input gradient left is done on this rank.
  for (size_t i = first; i < last; ++i)
    if (actions[i].kind == ActionKind::SendGradient) release_activations(m, actions[i].mb);
  return waited;
}

}  // namespace

PipelineStepResult run_pipeline_step(Model& m, Communicator& pp, const std::vector<Action>& actions,
                                     float ce_scale, float aux_grad, const MicroBatchLoader& load) {
  const ModelDims& d = m.dims;
  PipelineStepResult r;
  for (size_t i = 0; i < actions.size();) {
    const Action& a = actions[i];
    if (is_transfer(a.kind)) {
      size_t j = i;
      while (j < actions.size() && is_transfer(actions[j].kind)) ++j;
      r.wait_s += transfer(m, pp, actions, i, j, load);
      i = j;
      continue;
    }
    if (a.chunk != 0) throw std::logic_error("pipeline executor: model chunks (interleaving) are not supported");
    switch (a.kind) {
      case ActionKind::Forward:
        touch(m, a.mb, load);
        r.aux_sum += forward(m, a.mb, ce_scale, r.loss_sum);
        break;
      case ActionKind::Backward: {
        const MicroBatch micro{a.mb, is_last_backward(actions, i)};
        if (d.has_head) head_backward(m, micro);
        blocks_backward(m, micro, 0, d.L, aux_grad);
        if (d.has_embedding) {
          embedding_backward(m, micro);
          release_activations(m, a.mb);  // the first stage sends no gradient on
        }
        break;
      }
      default:
        throw std::logic_error("pipeline executor: " + describe(a) + " (split backwards) is not supported yet");
    }
    ++i;
  }
  return r;
}

PipelineStepResult run_pipeline_forward(Model& m, Communicator& pp, int64_t microbatches, const MicroBatchLoader& load) {
  const int stage = pp.rank(), stages = pp.size();
  PipelineStepResult r;
  for (int64_t mb = 0; mb < microbatches; ++mb) {
    touch(m, mb, load);
    if (stage > 0) {
      const auto t0 = clock_type::now();
      pp.batch_send_recv({{false, stage_input(m, mb), stage - 1}});
      r.wait_s += std::chrono::duration<double>(clock_type::now() - t0).count();
    }
    r.aux_sum += forward(m, mb, 0.f, r.loss_sum);
    if (stage + 1 < stages) {
      const auto t0 = clock_type::now();
      pp.batch_send_recv({{true, stage_output(m, mb), stage + 1}});
      r.wait_s += std::chrono::duration<double>(clock_type::now() - t0).count();
    }
    release_activations(m, mb);
  }
  return r;
}

}  // namespace trainer
