// The timeline recorder behind log.trace (docs/OBSERVABILITY.md "A timeline of
// every rank"): spans of this process's threads on the steady clock, kept in
// memory while a window of steps is recorded and taken out at its end
// (observe/trace_file.h turns them into one Chrome trace of all ranks).
//
// It sits at the bottom so that every layer can mark its own work: the loop
// its parts, the model its units, the communicators their collectives, the
// data and checkpoint threads theirs. Off, a span costs one relaxed atomic
// load; names are built only while recording.
//
// Tracks: every thread records on its own track (named by name_thread, or
// "thread N"); a span that belongs to another track (a collective's run on
// the wire, timed by the thread that waits for it) names its track. Spans of
// one track must nest; spans that may overlap on one track (sends and
// receives in flight together) are recorded as async spans.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::trace {

// Steady-clock nanoseconds: the clock every span is on.
int64_t now_ns();
bool on();
// Recording starts and stops for the whole process; start() clears what an
// earlier window left.
void start();
void stop();

// This thread's track name ("compute", "comm dp[tp0]", "data prefetch").
void name_thread(const std::string& name);

struct Event {
  int track = 0;
  const char* cat = "";  // a string literal: "forward", "backward", "comm", ...
  std::string name;
  int64_t t0_ns = 0, t1_ns = 0;
  std::string args;   // the body of a JSON object ("\"bytes\": 8"), or ""
  bool async = false;  // may overlap others of its track
};

// A finished span on this thread's track, or on the named one.
void span(const char* cat, std::string name, int64_t t0_ns, int64_t t1_ns, std::string args = "");
void span_on(const std::string& track, const char* cat, std::string name, int64_t t0_ns, int64_t t1_ns,
             std::string args = "", bool async = false);

struct Recording {
  std::vector<std::string> tracks;  // Event::track indexes it
  std::vector<Event> events;
};
// Everything recorded since start(); the recorder is left empty.
Recording take();

// A span of the enclosing scope on this thread's track, named "what",
// "what N" (index >= 0) or "what N mb M" (micro-batch mb >= 0).
class Scope {
 public:
  Scope(const char* cat, const char* what, int64_t index = -1, int64_t mb = -1)
      : cat_(cat), what_(what), index_(index), mb_(mb), t0_(on() ? now_ns() : -1) {}
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* cat_;
  const char* what_;
  int64_t index_, mb_, t0_;
};

}  // namespace trainer::trace
