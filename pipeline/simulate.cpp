#include "pipeline/simulate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

namespace trainer {

double ActionCosts::of(ActionKind k) const {
  switch (k) {
    case ActionKind::Forward: return forward;
    case ActionKind::Backward: return backward;
    case ActionKind::BackwardInput: return backward_input;
    case ActionKind::BackwardWeight: return backward_weight;
    default: return 0;
  }
}

double Simulation::bubble() const {
  if (busy.empty() || step_time <= 0) return 0;
  double idle = 0;
  for (double b : busy) idle += (step_time - b) / step_time;
  return idle / double(busy.size());
}

double theoretical_bubble(int stages, int microbatches) {
  return double(stages - 1) / double(microbatches + stages - 1);
}

TextbookBubble textbook_bubble(const Schedule& s) {
  const double p = s.stages, m = s.microbatches, v = s.chunks;
  switch (s.kind) {
    case ScheduleKind::Interleaved: return {"(p-1)/(v m + p-1)", (p - 1) / (v * m + p - 1)};
    case ScheduleKind::ZeroBubbleH1: return {"(p-1)/(3m + p-1)", (p - 1) / (3 * m + p - 1)};
    default: return {"(p-1)/(m+p-1)", theoretical_bubble(s.stages, s.microbatches)};
  }
}

namespace {

std::string at(int rank, size_t index, const Action& a) {
  return "rank " + std::to_string(rank) + " action " + std::to_string(index) + " " + describe(a);
}

// Every micro-batch's forward and backward on each of the rank's chunks
// exactly once, in order, with the transfers a compute action needs before
// it; empty when so, else what is wrong.
std::string check_rank(const Schedule& s, int r) {
  const auto& acts = s.ranks[size_t(r)];
  const int p = s.stages, V = s.virtual_stages();
  // Per (mb, chunk): index of F, B, BI, BW, and of the received input / gradient.
  struct Seen {
    long f = -1, b = -1, bi = -1, bw = -1, ra = -1, rg = -1;
  };
  std::map<std::pair<int, int>, Seen> seen;
  for (size_t i = 0; i < acts.size(); ++i) {
    const Action& a = acts[i];
    if (a.mb < 0 || a.mb >= s.microbatches || a.chunk < 0 || a.chunk >= s.chunks)
      return at(r, i, a) + ": micro-batch or chunk outside the schedule (" + std::to_string(s.microbatches) +
             " micro-batches, " + std::to_string(s.chunks) + " chunks)";
    const int vs = a.chunk * p + r;
    Seen& e = seen[{a.mb, a.chunk}];
    auto once = [&](long& slot) -> std::string {
      if (slot >= 0) return at(r, i, a) + ": appears twice (first as action " + std::to_string(slot) + ")";
      slot = long(i);
      return "";
    };
    std::string err;
    switch (a.kind) {
      case ActionKind::Forward:
        err = once(e.f);
        if (err.empty() && vs > 0 && e.ra < 0) err = at(r, i, a) + ": runs before its input activation is received";
        break;
      case ActionKind::Backward:
      case ActionKind::BackwardInput:
        err = once(a.kind == ActionKind::Backward ? e.b : e.bi);
        if (err.empty() && e.f < 0) err = at(r, i, a) + ": runs before the micro-batch's forward";
        if (err.empty() && vs + 1 < V && e.rg < 0) err = at(r, i, a) + ": runs before its output gradient is received";
        break;
      case ActionKind::BackwardWeight:
        err = once(e.bw);
        if (err.empty() && e.bi < 0) err = at(r, i, a) + ": runs before the input-gradient half (BI)";
        break;
      case ActionKind::RecvActivation:
        err = once(e.ra);
        break;
      case ActionKind::RecvGradient:
        err = once(e.rg);
        break;
      case ActionKind::SendActivation:
        if (e.f < 0) err = at(r, i, a) + ": sends an activation not computed yet";
        break;
      case ActionKind::SendGradient:
        if (e.b < 0 && e.bi < 0) err = at(r, i, a) + ": sends a gradient not computed yet";
        break;
    }
    if (!err.empty()) return err;
    // The next virtual stage for send-act and recv-grad, the previous one otherwise.
    const bool towards_next = a.kind == ActionKind::SendActivation || a.kind == ActionKind::RecvGradient;
    if (is_transfer(a.kind)) {
      const int other = towards_next ? vs + 1 : vs - 1;
      if (other < 0 || other >= V) return at(r, i, a) + ": there is no virtual stage " + std::to_string(other);
      if (a.peer != other % p)
        return at(r, i, a) + ": virtual stage " + std::to_string(other) + " lives on rank " + std::to_string(other % p);
    }
  }
  for (int mb = 0; mb < s.microbatches; ++mb)
    for (int c = 0; c < s.chunks; ++c) {
      const auto it = seen.find({mb, c});
      const std::string what = "rank " + std::to_string(r) + ": micro-batch " + std::to_string(mb) + " of chunk " +
                               std::to_string(c) + " ";
      if (it == seen.end() || it->second.f < 0) return what + "has no forward";
      const Seen& e = it->second;
      if (e.b < 0 && (e.bi < 0 || e.bw < 0))
        return what + "has no complete backward (B, or both BI and BW)";
      if (e.b >= 0 && (e.bi >= 0 || e.bw >= 0)) return what + "has both a whole and a split backward";
    }
  return "";
}

struct Op {
  int rank;
  size_t index;
};

// Pairs every send with its receive: the k-th message from a to b meets
// b's k-th receive from a. Fills partner[rank][action]; "" or what is wrong.
std::string pair_messages(const Schedule& s, std::vector<std::vector<Op>>& partner) {
  const int p = s.stages;
  std::map<std::pair<int, int>, std::vector<Op>> sends, recvs;
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < s.ranks[size_t(r)].size(); ++i) {
      const Action& a = s.ranks[size_t(r)][i];
      if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGradient) sends[{r, a.peer}].push_back({r, i});
      if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::RecvGradient) recvs[{a.peer, r}].push_back({r, i});
    }
  partner.assign(size_t(p), {});
  for (int r = 0; r < p; ++r) partner[size_t(r)].assign(s.ranks[size_t(r)].size(), Op{-1, 0});
  for (auto& [link, list] : sends) {
    const auto& rl = recvs[link];
    for (size_t k = 0; k < list.size(); ++k) {
      const Action& sa = s.ranks[size_t(list[k].rank)][list[k].index];
      if (k >= rl.size())
        return (at(list[k].rank, list[k].index, sa) + ": rank " + std::to_string(link.second) +
                    " never receives it");
      const Action& ra = s.ranks[size_t(rl[k].rank)][rl[k].index];
      const int to_vs = sa.kind == ActionKind::SendActivation ? sa.chunk * p + link.first + 1 : sa.chunk * p + link.first - 1;
      const bool kind_ok = (sa.kind == ActionKind::SendActivation) == (ra.kind == ActionKind::RecvActivation);
      if (!kind_ok || ra.mb != sa.mb || ra.chunk * p + link.second != to_vs)
        return (at(list[k].rank, list[k].index, sa) + " meets " + at(rl[k].rank, rl[k].index, ra) +
                    ": messages between two ranks pair up in order");
      partner[size_t(list[k].rank)][list[k].index] = rl[k];
      partner[size_t(rl[k].rank)][rl[k].index] = list[k];
    }
  }
  for (auto& [link, list] : recvs)
    if (list.size() > sends[link].size()) {
      const Op& o = list[sends[link].size()];
      return (at(o.rank, o.index, s.ranks[size_t(o.rank)][o.index]) + ": rank " + std::to_string(link.first) +
                  " never sends it");
    }
  return "";
}

// Per rank and action: the slots released after it, and the sends out of
// those slots that must have been received before the rank goes on.
void slot_release_sends(const Schedule& s, std::vector<std::vector<std::vector<SlotRef>>>& releases,
                        std::vector<std::vector<std::vector<size_t>>>& release_sends) {
  const int p = s.stages;
  release_sends.assign(size_t(p), {});
  for (int r = 0; r < p; ++r) {
    const auto& acts = s.ranks[size_t(r)];
    releases.push_back(slot_releases(acts, r, p));
    release_sends[size_t(r)].assign(acts.size(), {});
    for (size_t i = 0; i < acts.size(); ++i)
      for (const SlotRef& ref : releases.back()[i])
        for (size_t j = 0; j < acts.size(); ++j)
          if ((acts[j].kind == ActionKind::SendActivation || acts[j].kind == ActionKind::SendGradient) &&
              acts[j].mb == ref.mb && acts[j].chunk == ref.chunk)
            release_sends[size_t(r)][i].push_back(j);
  }
}

bool is_send(ActionKind k) { return k == ActionKind::SendActivation || k == ActionKind::SendGradient; }

// Runs the schedule: compute actions take their cost; a message moves once
// both of its ends have posted it and takes mode.transfer; a batch of
// consecutive transfers posts its sends (and its receives, unless posted
// one batch ahead) and finishes once its receives (with blocking sends:
// all of its messages) have arrived; after the action that releases a slot
// the rank waits until that slot's sends were received. Fills the
// timeline, busy time and step time; "" or the deadlock.
std::string run_events(const Schedule& s, const std::vector<ActionCosts>& costs, const TransferMode& mode,
                       const std::vector<std::vector<Op>>& partner,
                       const std::vector<std::vector<std::vector<size_t>>>& release_sends,
                       const std::vector<ReceivePosting>& posting, Simulation& sim) {
  const int p = s.stages;
  auto cost = [&](int r) -> const ActionCosts& { return costs.size() == 1 ? costs[0] : costs[size_t(r)]; };
  std::vector<size_t> pos(size_t(p), 0);
  std::vector<double> t(size_t(p), 0);
  // Per transfer action: when its rank posted it (-1: not yet).
  std::vector<std::vector<double>> posted{size_t(p)};
  for (int r = 0; r < p; ++r) posted[size_t(r)].assign(s.ranks[size_t(r)].size(), -1);
  auto post = [&](int r, size_t i) {
    if (posted[size_t(r)][i] < 0) posted[size_t(r)][i] = t[size_t(r)];
  };
  // When the message of transfer i of rank r has arrived; < 0: not known yet.
  auto arrived = [&](int r, size_t i) {
    const Op& o = partner[size_t(r)][i];
    const double mine = posted[size_t(r)][i], theirs = posted[size_t(o.rank)][o.index];
    return mine < 0 || theirs < 0 ? -1.0 : std::max(mine, theirs) + mode.transfer;
  };
  if (mode.early_receives)
    for (int r = 0; r < p; ++r)
      for (size_t i : posting[size_t(r)].at_start) post(r, i);
  // A rank past action i - 1 that still waits for the sends released there.
  std::vector<long> waiting(size_t(p), -1);
  sim.busy.assign(size_t(p), 0);
  sim.timeline.assign(size_t(p), {});
  auto batch_end = [&](int r) {
    size_t e = pos[size_t(r)];
    while (e < s.ranks[size_t(r)].size() && is_transfer(s.ranks[size_t(r)][e].kind)) ++e;
    return e;
  };
  // Whether rank r may go on past the releases after action i; moves its
  // time, then posts the receives due there.
  auto released = [&](int r, size_t i) {
    double finish = t[size_t(r)];
    for (size_t j : release_sends[size_t(r)][i]) {
      const double at = arrived(r, j);
      if (at < 0) return false;
      finish = std::max(finish, at);
    }
    t[size_t(r)] = finish;
    if (mode.early_receives)
      for (size_t k : posting[size_t(r)].after[i]) post(r, k);
    return true;
  };
  for (;;) {
    bool progressed = false, done = true;
    for (int r = 0; r < p; ++r) {
      const auto& acts = s.ranks[size_t(r)];
      for (;;) {
        if (waiting[size_t(r)] >= 0) {
          if (!released(r, size_t(waiting[size_t(r)]))) break;
          waiting[size_t(r)] = -1;
          progressed = true;
        }
        if (pos[size_t(r)] >= acts.size() || is_transfer(acts[pos[size_t(r)]].kind)) break;
        const Action& a = acts[pos[size_t(r)]];
        const double c = cost(r).of(a.kind);
        sim.timeline[size_t(r)].push_back({a, t[size_t(r)], t[size_t(r)] + c});
        t[size_t(r)] += c;
        sim.busy[size_t(r)] += c;
        waiting[size_t(r)] = long(pos[size_t(r)]);
        ++pos[size_t(r)];
        progressed = true;
      }
      if (pos[size_t(r)] < acts.size() || waiting[size_t(r)] >= 0) done = false;
      if (pos[size_t(r)] < acts.size() && waiting[size_t(r)] < 0)
        for (size_t i = pos[size_t(r)]; i < batch_end(r); ++i) post(r, i);
    }
    if (done) break;
    for (int r = 0; r < p; ++r) {
      if (pos[size_t(r)] >= s.ranks[size_t(r)].size() || waiting[size_t(r)] >= 0) continue;
      const auto& acts = s.ranks[size_t(r)];
      const size_t e = batch_end(r);
      if (e == pos[size_t(r)]) continue;
      double finish = t[size_t(r)];
      bool ready = true;
      for (size_t i = pos[size_t(r)]; i < e && ready; ++i) {
        if (is_send(acts[i].kind) && mode.nonblocking_sends) continue;
        const double at = arrived(r, i);
        ready = at >= 0;
        finish = std::max(finish, at);
      }
      if (!ready) continue;
      t[size_t(r)] = finish;
      pos[size_t(r)] = e;
      waiting[size_t(r)] = long(e - 1);
      progressed = true;
    }
    if (!progressed) {
      std::string why = "the schedule deadlocks:";
      for (int r = 0; r < p; ++r) {
        if (waiting[size_t(r)] >= 0)
          why += " rank " + std::to_string(r) + " waits for the sends of the slot it released after " +
                 at(r, size_t(waiting[size_t(r)]), s.ranks[size_t(r)][size_t(waiting[size_t(r)])]) + ";";
        else if (pos[size_t(r)] < s.ranks[size_t(r)].size())
          why += " " + at(r, pos[size_t(r)], s.ranks[size_t(r)][pos[size_t(r)]]) + " waits;";
      }
      why.pop_back();
      return (why);
    }
  }
  sim.step_time = *std::max_element(t.begin(), t.end());
  return "";
}

// The activation slots each rank holds at its peak, in all and per chunk,
// and the micro-batches in flight between forward and backward.
void count_slots(const Schedule& s, const std::vector<std::vector<std::vector<SlotRef>>>& releases,
                 const std::vector<ReceivePosting>& posting, bool early, Simulation& sim) {
  const int p = s.stages;
  sim.peak_in_flight.assign(size_t(p), 0);
  sim.peak_slots.assign(size_t(p), 0);
  sim.peak_chunk_slots.assign(size_t(p), std::vector<int>(size_t(s.chunks), 0));
  for (int r = 0; r < p; ++r) {
    const auto& acts = s.ranks[size_t(r)];
    int held = 0, slots = 0;
    std::vector<int> per_chunk(size_t(s.chunks), 0);
    std::map<std::pair<int, int>, bool> holding;
    auto take = [&](const Action& a) {
      if (!holding[{a.mb, a.chunk}]) {
        holding[{a.mb, a.chunk}] = true;
        ++slots;
        int& n = per_chunk[size_t(a.chunk)];
        n += 1;
        sim.peak_chunk_slots[size_t(r)][size_t(a.chunk)] = std::max(sim.peak_chunk_slots[size_t(r)][size_t(a.chunk)], n);
      }
    };
    auto give = [&](const SlotRef& ref) {
      if (holding[{ref.mb, ref.chunk}]) {
        holding[{ref.mb, ref.chunk}] = false;
        --slots;
        per_chunk[size_t(ref.chunk)] -= 1;
      }
    };
    // Receives posted one batch ahead take their slots then.
    auto take_posted = [&](const std::vector<size_t>& receives) {
      if (!early) return;
      for (size_t k : receives)
        if (acts[k].kind == ActionKind::RecvActivation) take(acts[k]);
      sim.peak_slots[size_t(r)] = std::max(sim.peak_slots[size_t(r)], slots);
    };
    take_posted(posting[size_t(r)].at_start);
    for (size_t i = 0; i < acts.size(); ++i) {
      const Action& a = acts[i];
      if (a.kind == ActionKind::RecvActivation || a.kind == ActionKind::Forward) take(a);
      if (a.kind == ActionKind::Forward) held += 1;
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) held -= 1;
      sim.peak_in_flight[size_t(r)] = std::max(sim.peak_in_flight[size_t(r)], held);
      // A batch receives before it sends: its slots count together.
      if (!is_transfer(a.kind) || i + 1 == acts.size() || !is_transfer(acts[i + 1].kind))
        sim.peak_slots[size_t(r)] = std::max(sim.peak_slots[size_t(r)], slots);
      for (const SlotRef& ref : releases[size_t(r)][i]) give(ref);
      take_posted(posting[size_t(r)].after[i]);
    }
  }
}

}  // namespace

Simulation simulate(const Schedule& s, const std::vector<ActionCosts>& costs, const TransferMode& mode) {
  Simulation sim;
  const int p = s.stages;
  auto fail = [&](std::string why) {
    sim.ok = false;
    sim.error = std::move(why);
    return sim;
  };
  if (int(s.ranks.size()) != p) return fail("the schedule has " + std::to_string(s.ranks.size()) + " ranks, " + std::to_string(p) + " stages");
  for (int r = 0; r < p; ++r)
    if (std::string e = check_rank(s, r); !e.empty()) return fail(e);
  std::vector<std::vector<Op>> partner;
  if (std::string e = pair_messages(s, partner); !e.empty()) return fail(e);
  if (costs.size() != 1 && int(costs.size()) != p) return fail("simulate: one cost entry per rank, or one for all");
  std::vector<std::vector<std::vector<SlotRef>>> releases;
  std::vector<std::vector<std::vector<size_t>>> release_sends;
  slot_release_sends(s, releases, release_sends);
  std::vector<ReceivePosting> posting;
  for (const auto& acts : s.ranks) posting.push_back(early_receive_posting(acts));
  if (std::string e = run_events(s, costs, mode, partner, release_sends, posting, sim); !e.empty()) return fail(e);
  count_slots(s, releases, posting, mode.early_receives, sim);
  sim.ok = true;
  return sim;
}

std::string format_timeline(const Simulation& sim, double unit) {
  size_t width = 2;
  bool chunks = false;
  for (const auto& row : sim.timeline)
    for (const TimedAction& ta : row) chunks |= ta.action.chunk > 0;
  auto label = [&](const Action& a) {
    const char* letter = a.kind == ActionKind::Forward          ? "F"
                         : a.kind == ActionKind::Backward       ? "B"
                         : a.kind == ActionKind::BackwardInput  ? "I"
                                                                : "W";
    // Appended piecewise: GCC 12 misreports a chain of string + as an overlapping memcpy (-Wrestrict).
    std::string l = letter;
    l += std::to_string(a.mb);
    if (chunks) {
      l += '.';
      l += std::to_string(a.chunk);
    }
    return l;
  };
  for (const auto& row : sim.timeline)
    for (const TimedAction& ta : row) width = std::max(width, label(ta.action).size());
  const size_t cells = size_t(std::ceil(sim.step_time / unit - 1e-9));
  std::string out;
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    std::vector<std::string> row(cells, std::string(width, ' '));
    for (std::string& c : row) c[width / 2] = '.';
    for (const TimedAction& ta : sim.timeline[r]) {
      std::string l = label(ta.action);
      l.resize(width, ' ');
      for (size_t c = size_t(std::llround(ta.start / unit)); c < size_t(std::llround(ta.end / unit)) && c < cells; ++c)
        row[c] = l;
    }
    out += "  rank " + std::to_string(r) + " |";
    for (const std::string& c : row) out += c + "|";
    out += "\n";
  }
  return out;
}

}  // namespace trainer
