// The emulated runtime's error state: CUDA's per-host-thread last error, the
// process's sticky error, and the texts cudaGetErrorName/String give, the
// emulator's explanation appended to the latest error of each code.
#include <atomic>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "emu/runtime_internal.h"

namespace trainer::emu::runtime {
namespace {

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

// The codes this runtime returns and the few more a caller may pass in, with
// the toolkit's own names and texts.
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* find_error(cudaError_t code) {
  for (const ErrorText& e : kErrors)
    if (e.code == code) return &e;
  return nullptr;
}

thread_local cudaError_t t_last_error = cudaSuccess;
std::atomic<cudaError_t> g_sticky{cudaSuccess};

// The latest explained text per code. cudaGetErrorString hands out pointers
// that stay valid for the process's life, so texts are kept, never freed.
struct Explanations {
  std::mutex mutex;
  std::deque<std::string> texts;
  std::map<int, const char*> latest;
};

Explanations& explanations() {
  static Explanations* e = new Explanations;  // never destroyed: callers may hold its texts at exit
  return *e;
}

void explain(cudaError_t code, const std::string& detail) {
  const ErrorText* e = find_error(code);
  Explanations& x = explanations();
  std::lock_guard<std::mutex> lock(x.mutex);
  // Appended piece by piece: g++ 12 warns (-Wrestrict, wrongly) on a chain of + here.
  std::string text = e ? e->text : "unrecognized error code";
  text += " (emulated CUDA device: ";
  text += detail;
  text += ')';
  x.texts.push_back(std::move(text));
  x.latest[int(code)] = x.texts.back().c_str();
}

}  // namespace

cudaError_t fail(cudaError_t code, const std::string& detail) {
  explain(code, detail);
  t_last_error = code;
  return code;
}

cudaError_t fault(cudaError_t code, const std::string& detail) {
  fail(code, detail);
  cudaError_t none = cudaSuccess;
  if (g_sticky.compare_exchange_strong(none, code))
    std::fprintf(stderr,
                 "emulated CUDA device: %s: %s\nemulated CUDA device: the error is sticky: every later CUDA call "
                 "of this process returns it, as after a fault on a GPU\n",
                 find_error(code) ? find_error(code)->name : "error", detail.c_str());
  return code;
}

cudaError_t sticky_error() { return g_sticky.load(); }

}  // namespace trainer::emu::runtime

using namespace trainer::emu::runtime;

cudaError_t cudaGetLastError() {
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  const cudaError_t sticky = sticky_error();
  return sticky != cudaSuccess ? sticky : e;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t sticky = sticky_error();
  return sticky != cudaSuccess ? sticky : t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* e = find_error(error);
  return e ? e->name : "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  Explanations& x = explanations();
  {
    std::lock_guard<std::mutex> lock(x.mutex);
    if (auto it = x.latest.find(int(error)); it != x.latest.end()) return it->second;
  }
  const ErrorText* e = find_error(error);
  return e ? e->text : "unrecognized error code";
}
