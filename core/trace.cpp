#include "core/trace.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>

namespace trainer::trace {

namespace {

std::atomic<bool> g_on{false};

// One lock for all threads: a few hundred spans per step, taken in turn.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> tracks;
  std::vector<Event> events;
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // never destroyed: threads may record at exit
  return *r;
}

int track_index_locked(Recorder& r, const std::string& name) {
  for (size_t i = 0; i < r.tracks.size(); ++i)
    if (r.tracks[i] == name) return int(i);
  r.tracks.push_back(name);
  return int(r.tracks.size() - 1);
}

thread_local std::string t_name;
std::atomic<int> g_threads{0};

const std::string& this_thread_track() {
  if (t_name.empty()) t_name = "thread " + std::to_string(g_threads.fetch_add(1) + 1);
  return t_name;
}

void add(const std::string& track, const char* cat, std::string name, int64_t t0, int64_t t1, std::string args,
         bool async) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> g(r.mu);
  if (!g_on.load(std::memory_order_relaxed)) return;
  Event e;
  e.track = track_index_locked(r, track);
  e.cat = cat;
  e.name = std::move(name);
  e.t0_ns = t0;
  e.t1_ns = t1 < t0 ? t0 : t1;
  e.args = std::move(args);
  e.async = async;
  r.events.push_back(std::move(e));
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool on() { return g_on.load(std::memory_order_relaxed); }

void start() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> g(r.mu);
  r.events.clear();
  r.tracks.clear();
  g_on.store(true);
}

void stop() { g_on.store(false); }

void name_thread(const std::string& name) { t_name = name; }

void span(const char* cat, std::string name, int64_t t0_ns, int64_t t1_ns, std::string args) {
  if (!on()) return;
  add(this_thread_track(), cat, std::move(name), t0_ns, t1_ns, std::move(args), false);
}

void span_on(const std::string& track, const char* cat, std::string name, int64_t t0_ns, int64_t t1_ns,
             std::string args, bool async) {
  if (!on()) return;
  add(track, cat, std::move(name), t0_ns, t1_ns, std::move(args), async);
}

Recording take() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> g(r.mu);
  Recording out{std::move(r.tracks), std::move(r.events)};
  r.tracks.clear();
  r.events.clear();
  return out;
}

Scope::~Scope() {
  if (t0_ < 0 || !on()) return;
  std::string name = what_;
  if (index_ >= 0) name += " " + std::to_string(index_);
  if (mb_ >= 0) name += " mb " + std::to_string(mb_);
  span(cat_, std::move(name), t0_, now_ns());
}

}  // namespace trainer::trace
