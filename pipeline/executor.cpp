#include "pipeline/executor.h"

#include <chrono>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/timed_communicator.h"
#include "core/trace.h"

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
  load(m, mb);
}

Model& chunk_of(const std::vector<Model*>& chunks, const Action& a) {
  if (a.chunk < 0 || a.chunk >= int(chunks.size()))
    throw std::logic_error("pipeline executor: " + describe(a) + " names a chunk this rank does not hold (" +
                           std::to_string(chunks.size()) + " chunk(s))");
  return *chunks[size_t(a.chunk)];
}

double forward(Model& m, int64_t mb, float ce_scale, double& loss) {
  const ModelDims& d = m.dims;
  const MicroBatch micro{mb, false};
  if (d.has_embedding) embedding_forward(m, micro);
  const double aux = blocks_forward(m, micro, 0, d.L);
  if (d.has_head) loss += head_forward(m, micro, ce_scale).loss_sum;
  return aux;
}

// The sends still on their way, per activation slot (chunk, micro-batch):
// a slot's buffers are reused only after its sends were delivered.
struct PendingSends {
  std::vector<std::pair<SlotRef, std::shared_ptr<Work>>> works;
  double wait(const SlotRef& ref) {
    const auto t0 = clock_type::now();
    for (auto it = works.begin(); it != works.end();)
      if (it->first == ref) {
        it->second->wait();
        it = works.erase(it);
      } else {
        ++it;
      }
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  double wait_all() {
    const auto t0 = clock_type::now();
    for (auto& [ref, work] : works) work->wait();
    works.clear();
    return std::chrono::duration<double>(clock_type::now() - t0).count();
  }
};

// Receives posted one batch ahead: the Work of each posting, by the index
// of each receive in it, waited for in the receive's batch.
struct EarlyReceives {
  std::map<size_t, std::shared_ptr<Work>> works;
  // Posts actions[receives]; the backend may decline (then they stay in
  // their batch). Their activation slots are taken now either way.
  void post(const std::vector<Model*>& chunks, Communicator& pp, const std::vector<Action>& actions,
            const std::vector<size_t>& receives, const MicroBatchLoader& load) {
    if (receives.empty()) return;
    std::vector<P2POp> ops;
    std::vector<size_t> posted;
    for (size_t k : receives) {
      const Action& a = actions[k];
      Model& m = chunk_of(chunks, a);
      if (a.kind == ActionKind::RecvActivation) touch(m, a.mb, load);
      // A chunk's message to another chunk of this rank is a copy in its batch.
      if (a.peer == pp.rank()) continue;
      ops.push_back({false, a.kind == ActionKind::RecvActivation ? stage_input(m, a.mb) : activation_grad(m, a.mb), a.peer});
      posted.push_back(k);
    }
    if (ops.empty()) return;
    const std::shared_ptr<Work> w = pp.post_receives(ops);
    if (w)
      for (size_t k : posted) works[k] = w;
  }
  // Waits for the postings of actions[first, last) that were posted early.
  void wait(size_t first, size_t last) {
    for (size_t i = first; i < last; ++i) {
      const auto it = works.find(i);
      if (it == works.end()) continue;
      const std::shared_ptr<Work> w = it->second;
      w->wait();
      for (auto j = works.begin(); j != works.end();) j = j->second == w ? works.erase(j) : std::next(j);
    }
  }
};

// The transfers actions[first, last) as one batch (less the receives posted
// early); returns once its receives arrived, its sends left with `pending`.
double transfer(const std::vector<Model*>& chunks, Communicator& pp, const std::vector<Action>& actions, size_t first,
                size_t last, const MicroBatchLoader& load, PendingSends& pending, EarlyReceives& early) {
  std::vector<P2POp> ops;
  for (size_t i = first; i < last; ++i) {
    const Action& a = actions[i];
    Model& m = chunk_of(chunks, a);
    const bool posted = early.works.count(i) > 0;
    switch (a.kind) {
      case ActionKind::RecvActivation:
        touch(m, a.mb, load);
        if (!posted) ops.push_back({false, stage_input(m, a.mb), a.peer});
        break;
      case ActionKind::SendActivation:
        ops.push_back({true, stage_output(m, a.mb), a.peer});
        break;
      case ActionKind::RecvGradient:
        if (!posted) ops.push_back({false, activation_grad(m, a.mb), a.peer});
        break;
      case ActionKind::SendGradient:
        ops.push_back({true, activation_grad(m, a.mb), a.peer});
        break;
      default:
        throw std::logic_error("pipeline executor: " + describe(a) + " is not a transfer");
    }
  }
  const auto t0 = clock_type::now();
  if (!ops.empty()) {
    const std::shared_ptr<Work> sends = pp.batch_send_recv_posted(ops);
    for (size_t i = first; i < last; ++i)
      if (actions[i].kind == ActionKind::SendActivation || actions[i].kind == ActionKind::SendGradient)
        pending.works.push_back({{actions[i].mb, actions[i].chunk}, sends});
  }
  early.wait(first, last);
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The timeline's name of a compute action ("forward mb 3", "backward input 1 mb 2" on chunk 1).
const char* action_span_name(ActionKind k) {
  switch (k) {
    case ActionKind::Forward: return "forward";
    case ActionKind::BackwardInput: return "backward input";
    case ActionKind::BackwardWeight: return "backward weight";
    default: return "backward";
  }
}

}  // namespace

PipelineStepResult run_pipeline_step(const std::vector<Model*>& chunks, Communicator& pp,
                                     const std::vector<Action>& actions, float ce_scale, float aux_grad,
                                     const MicroBatchLoader& load, const PipelineStepOptions& options) {
  PipelineStepResult r;
  const auto step0 = clock_type::now();
  auto since_start = [&](clock_type::time_point t) { return std::chrono::duration<double>(t - step0).count(); };
  const std::vector<std::vector<SlotRef>> releases = slot_releases(actions, pp.rank(), pp.size());
  const ReceivePosting posting = early_receive_posting(actions);
  const bool early_receives = options.mode.early_receives;
  PendingSends pending;
  EarlyReceives early;
  auto post_early = [&](const std::vector<size_t>& receives) {
    if (!early_receives) return;
    const auto t0 = clock_type::now();
    early.post(chunks, pp, actions, receives, load);
    r.wait_s += since_start(clock_type::now()) - since_start(t0);
  };
  // A micro-batch done with a chunk gives its slot back once its sends
  // left; then the receives due there are posted.
  auto release = [&](size_t after) {
    for (const SlotRef& ref : releases[after]) {
      r.wait_s += pending.wait(ref);
      release_activations(*chunks[size_t(ref.chunk)], ref.mb);
    }
    post_early(posting.after[after]);
  };
  post_early(posting.at_start);
  for (size_t i = 0; i < actions.size();) {
    const Action& a = actions[i];
    if (is_transfer(a.kind)) {
      size_t j = i;
      while (j < actions.size() && is_transfer(actions[j].kind)) ++j;
      r.wait_s += transfer(chunks, pp, actions, i, j, load, pending, early);
      if (!options.mode.nonblocking_sends) r.wait_s += pending.wait_all();
      release(j - 1);
      i = j;
      continue;
    }
    Model& m = chunk_of(chunks, a);
    const ModelDims& d = m.dims;
    const auto t0 = clock_type::now();
    const double blocked0 = total_blocked_seconds();
    if (options.on_compute) options.on_compute(a);
    const trace::Scope span(a.kind == ActionKind::Forward ? "forward" : "backward", action_span_name(a.kind),
                            chunks.size() > 1 ? a.chunk : -1, a.mb);
    switch (a.kind) {
      case ActionKind::Forward:
        touch(m, a.mb, load);
        r.aux_sum += forward(m, a.mb, ce_scale, r.loss_sum);
        break;
      case ActionKind::Backward: {
        const MicroBatch micro{a.mb, is_last_backward(actions, i)};
        if (d.has_head) head_backward(m, micro);
        blocks_backward(m, micro, 0, d.L, aux_grad);
        if (d.has_embedding) embedding_backward(m, micro);
        break;
      }
      case ActionKind::BackwardInput: {
        // The gradient the previous stage waits for; the weight half follows.
        const MicroBatch micro{a.mb, false};
        if (d.has_head) head_backward(m, micro, BackwardPart::Input);
        blocks_backward(m, micro, 0, d.L, aux_grad, BackwardPart::Input);
        break;
      }
      case ActionKind::BackwardWeight: {
        const MicroBatch micro{a.mb, is_last_backward(actions, i)};
        if (d.has_head) head_backward_weight(m, micro);
        blocks_backward_weight(m, micro, 0, d.L);
        if (d.has_embedding) embedding_backward(m, micro);
        break;
      }
      default:
        throw std::logic_error("pipeline executor: " + describe(a) + " is not a compute action");
    }
    const auto t1 = clock_type::now();
    const double busy = std::chrono::duration<double>(t1 - t0).count() - (total_blocked_seconds() - blocked0);
    (a.kind == ActionKind::Forward ? r.forward_s : r.backward_s) += busy;
    r.timeline.push_back({a, since_start(t0), since_start(t1)});
    release(i);
    ++i;
  }
  r.wait_s += pending.wait_all();
  return r;
}

PipelineStepResult run_pipeline_forward(const std::vector<Model*>& chunks, Communicator& pp, int64_t microbatches,
                                        const MicroBatchLoader& load) {
  const int stage = pp.rank(), stages = pp.size(), V = stages * int(chunks.size());
  PipelineStepResult r;
  auto timed = [&](const std::vector<P2POp>& ops) {
    const auto t0 = clock_type::now();
    pp.batch_send_recv(ops);
    r.wait_s += std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  for (int64_t mb = 0; mb < microbatches; ++mb)
    for (size_t c = 0; c < chunks.size(); ++c) {
      Model& m = *chunks[c];
      const int vs = int(c) * stages + stage;
      touch(m, mb, load);
      if (vs > 0) timed({{false, stage_input(m, mb), (stage + stages - 1) % stages}});
      r.aux_sum += forward(m, mb, 0.f, r.loss_sum);
      if (vs + 1 < V) timed({{true, stage_output(m, mb), (stage + 1) % stages}});
      release_activations(m, mb);
    }
  return r;
}

}  // namespace trainer
