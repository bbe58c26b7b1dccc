// Streams and events of the emulated device. Work is done when issued
// (runtime_internal.h), so a stream is always idle, an event complete once
// recorded, and a wait has nothing to wait for; what is kept is what a
// caller can still get wrong: handles used after destruction, the timing
// flag, the sticky error that synchronisation reports.
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_set>

#include "emu/runtime_internal.h"

struct CUstream_st {
  unsigned flags = 0;
  std::mutex mutex;  // held by the operation running on the stream
};

struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point at;
};

namespace trainer::emu::runtime {
namespace {

struct Handles {
  std::mutex mutex;
  std::unordered_set<const CUstream_st*> streams;
  std::unordered_set<const CUevent_st*> events;
};

Handles& handles() {
  static Handles* h = new Handles;  // never destroyed: handles are released in static destructors
  return *h;
}

bool is_default(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

bool valid_event(cudaEvent_t e) {
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  return h.events.count(e) != 0;
}

cudaError_t bad_stream(const char* api) {
  return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": not a live stream (destroyed, or never created)");
}

cudaError_t bad_event(const char* api) {
  return fail(cudaErrorInvalidResourceHandle, std::string(api) + ": not a live event (destroyed, or never created)");
}

}  // namespace

bool valid_stream(cudaStream_t stream) {
  if (is_default(stream)) return true;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  return h.streams.count(stream) != 0;
}

std::unique_lock<std::mutex> lock_stream(cudaStream_t stream) {
  static std::mutex legacy;
  thread_local std::mutex per_thread;
  if (stream == cudaStreamPerThread) return std::unique_lock<std::mutex>(per_thread);
  return std::unique_lock<std::mutex>(is_default(stream) ? legacy : stream->mutex);
}

}  // namespace trainer::emu::runtime

using namespace trainer::emu::runtime;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (!stream) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: a null pointer");
  if (flags & ~unsigned(cudaStreamNonBlocking))
    return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: unknown flags " + std::to_string(flags));
  auto* s = new CUstream_st;
  s->flags = flags;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.streams.insert(s);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (is_default(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: a default stream");
  {
    Handles& h = handles();
    std::lock_guard<std::mutex> lock(h.mutex);
    if (h.streams.erase(stream) == 0) return bad_stream("cudaStreamDestroy");
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!valid_stream(stream)) return bad_stream("cudaStreamSynchronize");
  return sticky_error();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (!valid_stream(stream)) return bad_stream("cudaStreamWaitEvent");
  if (!valid_event(event)) return bad_event("cudaStreamWaitEvent");
  return sticky_error();
}

cudaError_t cudaDeviceSynchronize() { return sticky_error(); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event) return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: a null pointer");
  auto* e = new CUevent_st;
  e->flags = flags;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mutex);
  h.events.insert(e);
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  {
    Handles& h = handles();
    std::lock_guard<std::mutex> lock(h.mutex);
    if (h.events.erase(event) == 0) return bad_event("cudaEventDestroy");
  }
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!valid_event(event)) return bad_event("cudaEventRecord");
  if (!valid_stream(stream)) return bad_stream("cudaEventRecord");
  auto lock = lock_stream(stream);
  event->recorded = true;
  event->at = std::chrono::steady_clock::now();
  return sticky_error();
}

// An event never recorded counts as complete, as in CUDA.
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!valid_event(event)) return bad_event("cudaEventSynchronize");
  return sticky_error();
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: a null pointer");
  if (!valid_event(start) || !valid_event(end)) return bad_event("cudaEventElapsedTime");
  if ((start->flags | end->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event created with cudaEventDisableTiming");
  if (!start->recorded || !end->recorded)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event that was never recorded");
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return sticky_error();
}
