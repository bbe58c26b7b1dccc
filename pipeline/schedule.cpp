#include "pipeline/schedule.h"

#include <stdexcept>

namespace trainer {

const char* action_name(ActionKind k) {
  switch (k) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::BackwardInput: return "BI";
    case ActionKind::BackwardWeight: return "BW";
    case ActionKind::SendActivation: return "send-act";
    case ActionKind::RecvActivation: return "recv-act";
    case ActionKind::SendGradient: return "send-grad";
    case ActionKind::RecvGradient: return "recv-grad";
  }
  return "?";
}

bool is_transfer(ActionKind k) {
  return k == ActionKind::SendActivation || k == ActionKind::RecvActivation || k == ActionKind::SendGradient ||
         k == ActionKind::RecvGradient;
}

std::string describe(const Action& a) {
  std::string s = std::string(action_name(a.kind)) + "(mb " + std::to_string(a.mb) + ", chunk " +
                  std::to_string(a.chunk) + ")";
  if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGradient)
    s += " -> rank " + std::to_string(a.peer);
  else if (is_transfer(a.kind))
    s += " <- rank " + std::to_string(a.peer);
  return s;
}

const char* schedule_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb-h1";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "zb-h1") return ScheduleKind::ZeroBubbleH1;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "' (gpipe | 1f1b | interleaved | zb-h1)");
}

bool splits_backward(ScheduleKind k) { return k == ScheduleKind::ZeroBubbleH1; }

void add_transfers(Schedule& s) {
  const int p = s.stages, V = s.virtual_stages();
  for (int r = 0; r < p; ++r) {
    const int prev = (r + p - 1) % p, next = (r + 1) % p;
    auto before = [&](const Action& a, std::vector<Action>& out) {  // what a compute action receives first
      const int vs = a.chunk * p + r;
      if (a.kind == ActionKind::Forward && vs > 0) out.push_back({ActionKind::RecvActivation, a.mb, a.chunk, prev});
      if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && vs + 1 < V)
        out.push_back({ActionKind::RecvGradient, a.mb, a.chunk, next});
    };
    auto after = [&](const Action& a, std::vector<Action>& out) {  // what it sends when done
      const int vs = a.chunk * p + r;
      if (a.kind == ActionKind::Forward && vs + 1 < V) out.push_back({ActionKind::SendActivation, a.mb, a.chunk, next});
      if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && vs > 0)
        out.push_back({ActionKind::SendGradient, a.mb, a.chunk, prev});
    };
    const std::vector<Action> compute = s.ranks[size_t(r)];
    std::vector<Action> out;
    for (size_t i = 0; i < compute.size(); ++i) {
      const Action& a = compute[i];
      // A forward followed by a backward runs as a pair: both inputs are
      // received first and both outputs sent after, so the sends of one pair
      // and the receives of the next share a batch (Megatron's
      // send_forward_backward_recv_forward_backward).
      if (a.paired && i + 1 < compute.size() && compute[i + 1].kind == ActionKind::Backward) {
        before(a, out);
        before(compute[i + 1], out);
        out.push_back(a);
        out.push_back(compute[i + 1]);
        after(a, out);
        after(compute[i + 1], out);
        ++i;
        continue;
      }
      before(a, out);
      out.push_back(a);
      after(a, out);
    }
    s.ranks[size_t(r)] = std::move(out);
  }
}

Schedule make_schedule(ScheduleKind kind, int stages, int microbatches, int chunks) {
  if (stages < 1) throw std::invalid_argument("make_schedule: stages must be >= 1");
  if (microbatches < 1) throw std::invalid_argument("make_schedule: micro-batches must be >= 1");
  if (chunks < 1) throw std::invalid_argument("make_schedule: chunks must be >= 1");
  if (chunks > 1 && kind != ScheduleKind::Interleaved)
    throw std::invalid_argument(std::string("the ") + schedule_name(kind) + " schedule has one model chunk per rank");
  Schedule s;
  s.kind = kind;
  s.stages = stages;
  s.chunks = chunks;
  s.microbatches = microbatches;
  for (int r = 0; r < stages; ++r)
    s.ranks.push_back(kind == ScheduleKind::GPipe         ? gpipe_order(stages, r, microbatches)
                      : kind == ScheduleKind::Interleaved ? interleaved_order(stages, r, chunks, microbatches)
                      : kind == ScheduleKind::ZeroBubbleH1 ? zb_h1_order(stages, r, microbatches)
                                                          : one_f_one_b_order(stages, r, microbatches));
  add_transfers(s);
  return s;
}

bool is_last_backward(const std::vector<Action>& actions, size_t index) {
  const Action& a = actions[index];
  auto backward = [](ActionKind k) {
    return k == ActionKind::Backward || k == ActionKind::BackwardWeight;
  };
  if (!backward(a.kind)) return false;
  for (size_t j = index + 1; j < actions.size(); ++j)
    if (backward(actions[j].kind) && actions[j].chunk == a.chunk) return false;
  return true;
}

std::vector<std::vector<SlotRef>> slot_releases(const std::vector<Action>& actions, int rank, int stages) {
  std::vector<std::vector<SlotRef>> out(actions.size());
  // Per (mb, chunk): whether the weight half and the gradient send are done.
  std::vector<std::pair<SlotRef, std::pair<bool, bool>>> state;
  auto entry = [&](const Action& a) -> std::pair<bool, bool>& {
    for (auto& [ref, st] : state)
      if (ref.mb == a.mb && ref.chunk == a.chunk) return st;
    const bool first_stage = a.chunk * stages + rank == 0;
    state.push_back({{a.mb, a.chunk}, {false, first_stage}});
    return state.back().second;
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    // The end of the batch this transfer belongs to.
    size_t at = i;
    if (is_transfer(a.kind))
      while (at + 1 < actions.size() && is_transfer(actions[at + 1].kind)) ++at;
    const bool weights = a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight;
    const bool sent = a.kind == ActionKind::SendGradient;
    if (!weights && !sent) continue;
    auto& st = entry(a);
    const bool before = st.first && st.second;
    (weights ? st.first : st.second) = true;
    if (!before && st.first && st.second) out[at].push_back({a.mb, a.chunk});
  }
  return out;
}

ReceivePosting early_receive_posting(const std::vector<Action>& actions) {
  ReceivePosting out;
  out.after.assign(actions.size(), {});
  // The end of the batch before the current one; none yet: the step's start.
  long previous_end = -1;
  for (size_t i = 0; i < actions.size();) {
    if (!is_transfer(actions[i].kind)) {
      ++i;
      continue;
    }
    size_t j = i;
    for (; j < actions.size() && is_transfer(actions[j].kind); ++j)
      if (actions[j].kind == ActionKind::RecvActivation || actions[j].kind == ActionKind::RecvGradient)
        (previous_end < 0 ? out.at_start : out.after[size_t(previous_end)]).push_back(j);
    previous_end = long(j - 1);
    i = j;
  }
  return out;
}

}  // namespace trainer
