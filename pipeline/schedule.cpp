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
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  throw std::invalid_argument("unknown pipeline schedule '" + name + "' (gpipe | 1f1b)");
}

void add_transfers(Schedule& s) {
  const int p = s.stages, V = s.virtual_stages();
  for (int r = 0; r < p; ++r) {
    std::vector<Action> out;
    for (const Action& a : s.ranks[size_t(r)]) {
      const int vs = a.chunk * p + r;  // virtual stage
      const int prev = (r + p - 1) % p, next = (r + 1) % p;
      switch (a.kind) {
        case ActionKind::Forward:
          if (vs > 0) out.push_back({ActionKind::RecvActivation, a.mb, a.chunk, prev});
          out.push_back(a);
          if (vs + 1 < V) out.push_back({ActionKind::SendActivation, a.mb, a.chunk, next});
          break;
        case ActionKind::Backward:
        case ActionKind::BackwardInput:
          if (vs + 1 < V) out.push_back({ActionKind::RecvGradient, a.mb, a.chunk, next});
          out.push_back(a);
          if (vs > 0) out.push_back({ActionKind::SendGradient, a.mb, a.chunk, prev});
          break;
        default:
          out.push_back(a);
      }
    }
    s.ranks[size_t(r)] = std::move(out);
  }
}

Schedule make_schedule(ScheduleKind kind, int stages, int microbatches) {
  if (stages < 1) throw std::invalid_argument("make_schedule: stages must be >= 1");
  if (microbatches < 1) throw std::invalid_argument("make_schedule: micro-batches must be >= 1");
  Schedule s;
  s.kind = kind;
  s.stages = stages;
  s.microbatches = microbatches;
  for (int r = 0; r < stages; ++r)
    s.ranks.push_back(kind == ScheduleKind::GPipe ? gpipe_order(stages, r, microbatches)
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

}  // namespace trainer
