#include "observe/trace_file.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <stdexcept>

namespace trainer {

namespace {

constexpr int kClockRounds = 8;
constexpr double kTraceTimeoutS = 600;
constexpr size_t kChunkBytes = size_t{32} << 20;  // under the store's value limit

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string micros(int64_t ns) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", double(ns) * 1e-3);
  return buf;
}

// The compute thread first, then the other tracks by name.
std::vector<int> track_order(const std::vector<std::string>& tracks) {
  std::vector<int> order(tracks.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const bool ca = tracks[size_t(a)] == "compute", cb = tracks[size_t(b)] == "compute";
    if (ca != cb) return ca;
    return tracks[size_t(a)] < tracks[size_t(b)];
  });
  return order;
}

std::string metadata(const char* what, int pid, int tid, const std::string& arg) {
  return "{\"name\": \"" + std::string(what) + "\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
         (tid >= 0 ? ", \"tid\": " + std::to_string(tid) : "") + ", \"args\": {" + arg + "}}";
}

// Rank 0 answers each rank's pings with its clock, one rank at a time;
// the round with the shortest round trip gives the offset.
ClockOffset ping_lead(Store& store, int rank) {
  ClockOffset best{0, -1};
  for (int k = 0; k < kClockRounds; ++k) {
    const std::string key = "trace/" + std::to_string(rank) + "/" + std::to_string(k);
    const int64_t ta = trace::now_ns();
    store.set(key + "/ping", "");
    const int64_t lead = std::stoll(store.get(key + "/pong", kTraceTimeoutS));
    const int64_t tb = trace::now_ns();
    if (best.rtt_ns < 0 || tb - ta < best.rtt_ns) best = {(ta + tb) / 2 - lead, tb - ta};
  }
  return best;
}

void answer_pings(Store& store, int rank) {
  for (int k = 0; k < kClockRounds; ++k) {
    const std::string key = "trace/" + std::to_string(rank) + "/" + std::to_string(k);
    store.get(key + "/ping", kTraceTimeoutS);
    store.set(key + "/pong", std::to_string(trace::now_ns()));
    store.del(key + "/ping");
  }
}

// Only once the rank's spans arrived: by then it has read every answer.
void forget_pongs(Store& store, int rank) {
  for (int k = 0; k < kClockRounds; ++k) store.del("trace/" + std::to_string(rank) + "/" + std::to_string(k) + "/pong");
}

void send_text(Store& store, int rank, const std::string& text) {
  const std::string key = "trace/" + std::to_string(rank) + "/events/";
  const size_t n = (text.size() + kChunkBytes - 1) / kChunkBytes;
  for (size_t i = 0; i < n; ++i) store.set(key + std::to_string(i), text.substr(i * kChunkBytes, kChunkBytes));
  store.set(key + "n", std::to_string(n));
}

std::string receive_text(Store& store, int rank) {
  const std::string key = "trace/" + std::to_string(rank) + "/events/";
  const int64_t n = std::stoll(store.get(key + "n", kTraceTimeoutS));
  std::string text;
  for (int64_t i = 0; i < n; ++i) {
    text += store.get(key + std::to_string(i), kTraceTimeoutS);
    store.del(key + std::to_string(i));
  }
  store.del(key + "n");
  return text;
}

int64_t first_start(const trace::Recording& rec) {
  int64_t t = trace::now_ns();
  for (const trace::Event& e : rec.events) t = std::min(t, e.t0_ns);
  return t;
}

}  // namespace

std::string chrome_events(const trace::Recording& rec, int pid, const std::string& process_name, int64_t offset_ns,
                          int64_t origin_ns) {
  const std::vector<int> order = track_order(rec.tracks);
  std::vector<int> tid(rec.tracks.size());
  for (size_t i = 0; i < order.size(); ++i) tid[size_t(order[i])] = int(i) + 1;
  std::vector<std::string> out;
  out.push_back(metadata("process_name", pid, -1, "\"name\": " + json_string(process_name)));
  out.push_back(metadata("process_sort_index", pid, -1, "\"sort_index\": " + std::to_string(pid)));
  for (size_t i = 0; i < rec.tracks.size(); ++i) {
    out.push_back(metadata("thread_name", pid, tid[i], "\"name\": " + json_string(rec.tracks[i])));
    out.push_back(metadata("thread_sort_index", pid, tid[i], "\"sort_index\": " + std::to_string(tid[i])));
  }
  const std::string where = "\"pid\": " + std::to_string(pid) + ", \"tid\": ";
  int64_t async_id = 0;
  for (const trace::Event& e : rec.events) {
    const std::string head = "{\"name\": " + json_string(e.name) + ", \"cat\": \"" + e.cat + "\", ";
    const std::string args = e.args.empty() ? "" : ", \"args\": {" + e.args + "}";
    const std::string t0 = micros(e.t0_ns - offset_ns - origin_ns);
    const std::string place = where + std::to_string(tid[size_t(e.track)]);
    if (!e.async) {
      out.push_back(head + "\"ph\": \"X\", \"ts\": " + t0 + ", \"dur\": " + micros(e.t1_ns - e.t0_ns) + ", " + place +
                    args + "}");
    } else {
      const std::string id = ", \"id\": \"" + std::to_string(pid) + "." + std::to_string(async_id++) + "\"";
      out.push_back(head + "\"ph\": \"b\", \"ts\": " + t0 + ", " + place + id + args + "}");
      out.push_back(head + "\"ph\": \"e\", \"ts\": " + micros(e.t1_ns - offset_ns - origin_ns) + ", " + place + id +
                    "}");
    }
  }
  std::string text;
  for (const std::string& s : out) text += (text.empty() ? "" : ",\n") + s;
  return text;
}

std::string chrome_document(const std::vector<std::string>& event_lists, const std::string& other_json) {
  std::string text = "{\"traceEvents\": [\n";
  bool first = true;
  for (const std::string& l : event_lists) {
    if (l.empty()) continue;
    text += (first ? "" : ",\n") + l;
    first = false;
  }
  return text + "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {" + other_json + "}}\n";
}

void write_trace_file(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  {
    std::ofstream f(partial, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw std::runtime_error("log.trace: cannot write " + partial);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0)
    throw std::runtime_error("log.trace: cannot rename " + partial + " to " + path);
}

std::string simulated_trace(const Schedule& schedule, const Simulation& sim, double ms_per_unit) {
  const double unit_ns = ms_per_unit * 1e6;
  std::vector<std::string> lists;
  for (size_t r = 0; r < sim.timeline.size(); ++r) {
    trace::Recording rec;
    rec.tracks = {"compute"};
    for (const TimedAction& t : sim.timeline[r]) {
      trace::Event e;
      const Action& a = t.action;
      e.cat = a.kind == ActionKind::Forward ? "forward" : "backward";
      e.name = std::string(a.kind == ActionKind::Forward          ? "forward"
                           : a.kind == ActionKind::BackwardInput  ? "backward input"
                           : a.kind == ActionKind::BackwardWeight ? "backward weight"
                                                                  : "backward") +
               (schedule.chunks > 1 ? " " + std::to_string(a.chunk) : "") + " mb " + std::to_string(a.mb);
      e.t0_ns = int64_t(t.start * unit_ns);
      e.t1_ns = int64_t(t.end * unit_ns);
      rec.events.push_back(std::move(e));
    }
    lists.push_back(chrome_events(rec, int(r), "stage " + std::to_string(r) + " (simulated)", 0, 0));
  }
  char other[200];
  std::snprintf(other, sizeof other, "\"simulated\": true, \"ms_per_unit\": %g, \"bubble\": %.4f, \"step_ms\": %.3f",
                ms_per_unit, sim.bubble(), sim.step_time * ms_per_unit);
  return chrome_document(lists, other);
}

RunTrace::RunTrace(Setup s) : s_(std::move(s)) { trace::name_thread("compute"); }

void RunTrace::before_step(int64_t step) {
  if (!s_.steps || recording_ || done_ || step < s_.steps->first || step > s_.steps->last) return;
  trace::start();
  recording_ = true;
  first_seen_ = step;
}

bool RunTrace::writes_after(int64_t step) const { return recording_ && step >= s_.steps->last; }

void RunTrace::after_step(int64_t step) {
  if (!recording_) return;
  last_seen_ = step;
  if (step >= s_.steps->last) write();
}

void RunTrace::finish() {
  if (recording_) write();
}

// Rank 0 takes the ranks in turn: their clock rounds, then their spans, so
// that the store holds one rank's spans at a time.
void RunTrace::write() {
  trace::stop();
  recording_ = false;
  done_ = true;
  const trace::Recording rec = trace::take();
  const std::string name = "rank " + std::to_string(s_.rank) + (s_.host.empty() ? "" : " (" + s_.host + ")");
  if (s_.rank != 0) {
    s_.store->get("trace/" + std::to_string(s_.rank) + "/go", kTraceTimeoutS);
    const ClockOffset c = ping_lead(*s_.store, s_.rank);
    const int64_t origin = std::stoll(s_.store->get("trace/origin", kTraceTimeoutS));
    send_text(*s_.store, s_.rank,
              std::to_string(c.offset_ns) + " " + std::to_string(c.rtt_ns) + "\n" +
                  chrome_events(rec, s_.rank, name, c.offset_ns, origin));
    return;
  }
  const int64_t origin = first_start(rec);
  std::vector<std::string> lists{chrome_events(rec, 0, name, 0, origin)};
  std::vector<ClockOffset> clocks{{0, 0}};
  if (s_.world > 1) {
    s_.store->set("trace/origin", std::to_string(origin));
    for (int r = 1; r < s_.world; ++r) {
      s_.store->set("trace/" + std::to_string(r) + "/go", "");
      answer_pings(*s_.store, r);
      std::string text = receive_text(*s_.store, r);
      forget_pongs(*s_.store, r);
      s_.store->del("trace/" + std::to_string(r) + "/go");
      const size_t nl = text.find('\n');
      ClockOffset c;
      if (nl == std::string::npos || std::sscanf(text.c_str(), "%lld %lld", reinterpret_cast<long long*>(&c.offset_ns),
                                                 reinterpret_cast<long long*>(&c.rtt_ns)) != 2)
        throw std::runtime_error("log.trace: rank " + std::to_string(r) + " sent a malformed trace");
      clocks.push_back(c);
      lists.push_back(text.substr(nl + 1));
    }
  }
  std::string offsets, rtts;
  double worst = 0, worst_rtt = 0;
  for (const ClockOffset& c : clocks) {
    offsets += (offsets.empty() ? "" : ", ") + micros(c.offset_ns / 1000);
    rtts += (rtts.empty() ? "" : ", ") + micros(c.rtt_ns / 1000);
    worst = std::max(worst, std::abs(double(c.offset_ns)) * 1e-6);
    worst_rtt = std::max(worst_rtt, double(c.rtt_ns) * 1e-6);
  }
  const std::string steps =
      std::to_string(first_seen_) + (last_seen_ > first_seen_ ? "-" + std::to_string(last_seen_) : "");
  const std::string other = "\"steps\": \"" + steps + "\", \"ranks\": " + std::to_string(s_.world) +
                            ", \"clock_offset_ms\": [" + offsets + "], \"clock_round_trip_ms\": [" + rtts + "]";
  const std::string text = chrome_document(lists, other);
  write_trace_file(s_.path, text);
  if (!s_.quiet)
    std::printf("trace: step%s %s of %d rank%s -> %s (%.1f MB); clocks aligned to rank 0 through the store: offsets up "
                "to %.3f ms, each good to half its round trip (at most %.3f ms)\n",
                last_seen_ > first_seen_ ? "s" : "", steps.c_str(), s_.world, s_.world == 1 ? "" : "s", s_.path.c_str(), double(text.size()) / 1e6, worst,
                worst_rtt / 2);
}

}  // namespace trainer
