// Helpers of the GPU op tests (tests/gpu): device tensors owned by the test,
// host-side rounding to BF16/F16, uploads and downloads, NaN poisoning, and
// the comparison that decides pass or fail.
//
// Method. Random host inputs are rounded to the test dtype first, and the
// CPU reference (kernels/cpu, fp32) is fed exactly those rounded values, so an
// error measures the kernel, not the input rounding. Outputs a kernel must
// overwrite are poisoned with NaN before every run, so an element it forgets
// to write shows up as NaN, and NaN never passes. Every op call is followed
// by a device synchronisation that names the op, so an asynchronous fault is
// reported against the kernel that caused it.
//
// Uploads and downloads encode and decode BF16/F16 on the host rather than
// through ops::convert: a broken convert kernel then fails its own test
// (which checks it bit for bit against this encoder) instead of every test.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/cuda_backend.h"
#include "core/device_memory.h"
#include "core/half_float.h"
#include "core/tensor.h"

namespace trainer::gputest {

// ---- tolerances: one place ----------------------------------------------------
// Relative error ||gpu - cpu||_2 / ||cpu||_2 allowed for an output stored in
// the given dtype. F32 outputs differ from the fp32 reference only by the order
// of fp32 operations. A BF16 or F16 output carries its own rounding (2^-9 and
// 2^-12 relative, half of that on average) plus the roundings of
// low-precision intermediates a fast kernel keeps (attention's P in bf16,
// cuBLASLt's bf16 epilogues).
constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 2e-2;
constexpr double kTolF16 = 5e-3;

inline double tol(DType dt) {
  switch (dt) {
    case DType::F32:
      return kTolF32;
    case DType::BF16:
      return kTolBF16;
    case DType::F16:
      return kTolF16;
    default:
      throw std::logic_error(std::string("tol: no tolerance for ") + dtype_name(dt));
  }
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
// Index outputs are poisoned with a value no op ever writes (-1 means dropped).
constexpr int32_t kPoisonI32 = std::numeric_limits<int32_t>::min();

// Seeds are a pure function of a base (GPU_TESTS_SEED, printed by main) and a
// per-case number, so a failure is reproduced by rerunning with the same base.
inline uint64_t g_seed_base = 20240611;
inline uint64_t seed(uint64_t k) { return g_seed_base * 1000003ull + k * 7919ull; }

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---- host rounding, round to nearest even as __float2bfloat16 / __float2half --
inline uint16_t bf16_bits(float f) { return bf16_from_f32(f); }
inline float from_bf16_bits(uint16_t b) { return f32_from_bf16(b); }
// GCC's _Float16 converts in software with IEEE round to nearest even,
// subnormals and overflow to inf included.
inline uint16_t f16_bits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float from_f16_bits(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

inline float round_to(DType dt, float x) {
  switch (dt) {
    case DType::F32:
      return x;
    case DType::BF16:
      return from_bf16_bits(bf16_bits(x));
    case DType::F16:
      return from_f16_bits(f16_bits(x));
    default:
      throw std::logic_error(std::string("round_to: ") + dtype_name(dt));
  }
}
inline std::vector<float> rounded(DType dt, std::vector<float> v) {
  for (float& x : v) x = round_to(dt, x);
  return v;
}

// Bytes of a float tensor of dtype dt holding the values v (rounded).
inline std::vector<uint8_t> encode(const std::vector<float>& v, DType dt) {
  if (dt != DType::F32 && dt != DType::BF16 && dt != DType::F16)
    throw std::logic_error(std::string("encode: ") + dtype_name(dt));
  std::vector<uint8_t> out(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t b = dt == DType::BF16 ? bf16_bits(v[i]) : f16_bits(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    }
  }
  return out;
}
inline std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dt) {
  const size_t n = bytes.size() / dtype_size(dt);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::F32) {
      std::memcpy(&out[i], &bytes[i * 4], 4);
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      if (dt == DType::BF16)
        out[i] = from_bf16_bits(b);
      else if (dt == DType::F16)
        out[i] = from_f16_bits(b);
      else
        throw std::logic_error(std::string("decode: ") + dtype_name(dt));
    }
  }
  return out;
}

// ---- random host data, already rounded to the test dtype -----------------------
inline std::vector<float> randn(size_t n, uint64_t s, float stddev = 1.f, DType dt = DType::F32,
                                float mean = 0.f) {
  std::mt19937_64 g(s);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = round_to(dt, d(g));
  return v;
}
inline std::vector<int32_t> rand_ints(size_t n, uint64_t s, int lo, int hi) {
  std::mt19937_64 g(s);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(g);
  return v;
}

// Separate documents (attention's doc_start): [B, T] I32, each token's
// document start, from each batch row's document lengths (summing to T).
inline std::vector<int32_t> doc_starts(const std::vector<std::vector<int32_t>>& lengths, int64_t T) {
  std::vector<int32_t> start;
  for (const std::vector<int32_t>& row : lengths) {
    int32_t first = 0;
    for (const int32_t n : row) {
      start.insert(start.end(), size_t(n), first);
      first += n;
    }
    if (first != T) throw std::logic_error("doc_starts: lengths do not sum to T");
  }
  return start;
}

// ---- host views for the CPU reference -------------------------------------------
inline Tensor make_tensor(void* p, DType dt, const std::vector<int64_t>& shape, Device dev) {
  if (shape.size() > size_t(kMaxDims)) throw std::logic_error("make_tensor: more than 4 dims");
  Tensor t;
  t.data = p;
  t.dtype = dt;
  t.device = dev;
  t.ndim = int(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}
inline int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
// Inputs are passed as const vectors; the CPU ops only read their inputs.
inline Tensor host(const std::vector<float>& v, const std::vector<int64_t>& shape) {
  if (int64_t(v.size()) != numel_of(shape)) throw std::logic_error("host: size vs shape");
  return make_tensor(const_cast<float*>(v.data()), DType::F32, shape, Device::CPU);
}
inline Tensor host_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  if (int64_t(v.size()) != numel_of(shape)) throw std::logic_error("host_i32: size vs shape");
  return make_tensor(const_cast<int32_t*>(v.data()), DType::I32, shape, Device::CPU);
}

// ops.cpp picks the backend from the first tensor argument, and an absent
// Tensor{} says CPU; an absent first argument is therefore marked CUDA so the
// call reaches the CUDA backend. (The model never passes one absent there.)
inline Tensor absent_cuda() {
  Tensor t;
  t.device = Device::CUDA;
  return t;
}

// ---- the emulated device -------------------------------------------------------
// Whether the device is the emulated one (libtrainer_cuda_emu.so on the CPU,
// emu/runtime_device.cpp names it so): shapes sized for a GPU are minutes
// there, so cases pick smaller ones that still reach the same edges.
inline bool emulated() {
  static const bool is = [] {
    int dev = 0;
    cudaDeviceProp p{};
    return cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess &&
           std::strstr(p.name, "Emulated") != nullptr;
  }();
  return is;
}
// Whether cases take the emulator's shapes: on the emulated device, unless
// GPU_TESTS_SHAPES=gpu asks for the GPU's there (hours, for a bug hunt).
inline bool emulator_shapes() {
  static const bool small = [] {
    const char* v = std::getenv("GPU_TESTS_SHAPES");
    return emulated() && !(v && std::string(v) == "gpu");
  }();
  return small;
}
// The GPU's size, or the emulator's where emulator_shapes().
template <class T>
T gpu_or_emu(T gpu, T emu) {
  return emulator_shapes() ? emu : gpu;
}

// ---- device synchronisation that names the op -----------------------------------
// A sticky error (an illegal address, say) leaves the context unusable; the
// first one is remembered so that later cases say why they cannot run
// instead of failing with unrelated CUDA errors.
inline std::string g_device_broken;

// The emulated module keeps its CUDA runtime to itself (emu/cuda_module.cmake)
// and this program links another copy, which never sees the module's errors;
// the module's own synchronisation does (it throws the sticky error of a
// kernel fault; a launch error the op has thrown already). "" when none.
inline std::string emulated_module_error() {
  std::string why;
  const CudaBackend* runtime = cuda_backend(&why);
  if (!runtime) return "no CUDA module: " + why;
  try {
    runtime->synchronize();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Whether waiting for the device fails: a sticky error, once
// cudaGetLastError has taken a plain one.
inline bool device_unusable() {
  return emulated() ? !emulated_module_error().empty() : cudaDeviceSynchronize() != cudaSuccess;
}

inline void sync_emulated(const std::string& after) {
  const std::string error = emulated_module_error();
  if (error.empty()) return;
  const std::string msg = "CUDA error after " + after + ": " + error;
  if (g_device_broken.empty()) g_device_broken = msg;
  throw std::runtime_error(msg);
}

inline void sync(const std::string& after) {
  if (emulated()) return sync_emulated(after);
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess) {
    const std::string msg =
        "CUDA error after " + after + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    if (device_unusable() && g_device_broken.empty()) g_device_broken = msg;
    throw std::runtime_error(msg);
  }
}

// ---- device tensors owned by a test ----------------------------------------------
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(const std::vector<int64_t>& shape, DType dt) {
    const size_t bytes = size_t(numel_of(shape)) * dtype_size(dt);
    if (bytes == 0) throw std::logic_error("DeviceTensor: empty shape");
    t_ = make_tensor(device_alloc(bytes, Device::CUDA, "gpu test tensor"), dt, shape, Device::CUDA);
  }
  ~DeviceTensor() { device_free(t_.data, Device::CUDA); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DeviceTensor(DeviceTensor&& o) noexcept : t_(std::exchange(o.t_, Tensor{})) {}
  DeviceTensor& operator=(DeviceTensor&& o) noexcept {
    if (this != &o) {
      device_free(t_.data, Device::CUDA);
      t_ = std::exchange(o.t_, Tensor{});
    }
    return *this;
  }
  const Tensor& t() const { return t_; }
  operator Tensor() const { return t_; }
  DType dtype() const { return t_.dtype; }
  int64_t numel() const { return t_.numel(); }
  Tensor view(std::initializer_list<int64_t> dims) const { return t_.view(dims); }

 private:
  Tensor t_;
};

// write_from_host is ordered on the compute stream; the device sync after
// every write reports a fault of the upload (or of the op before it) against
// the tensor being written.
inline void write_bytes(const Tensor& t, const std::vector<uint8_t>& bytes) {
  if (bytes.size() != t.nbytes()) throw std::logic_error("write_bytes: size mismatch");
  write_from_host(t, bytes.data());
  sync("upload " + t.shape_str());
}
inline void write(const Tensor& t, const std::vector<float>& v) {
  if (int64_t(v.size()) != t.numel())
    throw std::logic_error("write: size mismatch " + t.shape_str());
  write_bytes(t, encode(v, t.dtype));
}
inline void write_i32(const Tensor& t, const std::vector<int32_t>& v) {
  if (t.dtype != DType::I32 || int64_t(v.size()) != t.numel())
    throw std::logic_error("write_i32: dtype or size mismatch " + t.shape_str());
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  write_bytes(t, bytes);
}
inline DeviceTensor upload(const std::vector<float>& v, const std::vector<int64_t>& shape,
                           DType dt) {
  DeviceTensor d(shape, dt);
  write(d, v);
  return d;
}
inline DeviceTensor upload_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
  DeviceTensor d(shape, DType::I32);
  write_i32(d, v);
  return d;
}

inline std::vector<uint8_t> download_bytes(const Tensor& t) {
  std::vector<uint8_t> bytes(t.nbytes());
  read_to_host(t, bytes.data());
  return bytes;
}
inline std::vector<float> download(const Tensor& t) { return decode(download_bytes(t), t.dtype); }
inline std::vector<int32_t> download_i32(const Tensor& t) {
  if (t.dtype != DType::I32)
    throw std::logic_error("download_i32 on " + std::string(dtype_name(t.dtype)));
  std::vector<int32_t> v(size_t(t.numel()));
  read_to_host(t, v.data());
  return v;
}

// Every output the op must overwrite gets NaN (or kPoisonI32) first; written
// from the host so that poisoning does not depend on the fill kernel.
inline void poison(const Tensor& t) {
  if (t.dtype == DType::I32) {
    write_i32(t, std::vector<int32_t>(size_t(t.numel()), kPoisonI32));
    return;
  }
  write(t, std::vector<float>(size_t(t.numel()), kNaN));
}

// ---- comparisons ------------------------------------------------------------------
// ||gpu - cpu|| / max(||cpu||, denom_floor) against rel_tol; any NaN or Inf in
// the GPU output fails (as does a non-finite reference: the test is then
// wrong). denom_floor is for outputs that cancel to ~0 mathematically, whose
// rounding noise is judged on the scale of a related output. Prints one line.
inline bool compare(const std::string& label, const std::vector<float>& gpu,
                    const std::vector<float>& cpu, double rel_tol, double denom_floor = 0) {
  std::string line;
  bool ok = true;
  if (gpu.size() != cpu.size()) {
    line = fmt("[gpu] %-64s FAIL: %zu GPU values vs %zu reference values", label.c_str(),
               gpu.size(), cpu.size());
    ok = false;
  } else {
    size_t bad_gpu = 0, bad_cpu = 0, first_bad = 0, worst = 0;
    double diff2 = 0, ref2 = 0, max_abs = 0;
    for (size_t i = 0; i < gpu.size(); ++i) {
      const double g = gpu[i], c = cpu[i];
      if (!std::isfinite(c)) {
        ++bad_cpu;
        continue;
      }
      if (!std::isfinite(g)) {
        if (bad_gpu++ == 0) first_bad = i;
        continue;
      }
      diff2 += (g - c) * (g - c);
      ref2 += c * c;
      if (std::fabs(g - c) > max_abs) {
        max_abs = std::fabs(g - c);
        worst = i;
      }
    }
    const double denom = std::max(std::sqrt(ref2), denom_floor);
    const double rel = denom > 0 ? std::sqrt(diff2) / denom : (diff2 > 0 ? kInf : 0.0);
    ok = bad_gpu == 0 && bad_cpu == 0 && rel <= rel_tol;
    line = fmt("[gpu] %-64s rel=%.3e max_abs=%.3e tol=%.1e n=%zu %s", label.c_str(), rel, max_abs,
               rel_tol, gpu.size(), ok ? "ok" : "FAIL");
    if (!gpu.empty() && bad_gpu == 0 && bad_cpu == 0 && !ok)
      line +=
          fmt(" (worst at %zu: gpu %.7g cpu %.7g)", worst, double(gpu[worst]), double(cpu[worst]));
    if (bad_gpu)
      line += fmt(" -- %zu NaN/Inf in the GPU output, first at %zu (unwritten or overflowed)",
                  bad_gpu, first_bad);
    if (bad_cpu) line += fmt(" -- %zu non-finite reference values (test bug)", bad_cpu);
  }
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  return ok;
}

// Bit-for-bit equality (determinism, index outputs, exact copies).
inline bool same_bits(const std::string& label, const std::vector<uint8_t>& a,
                      const std::vector<uint8_t>& b, size_t elem_size) {
  size_t diff = 0, first = 0;
  const size_t n = std::min(a.size(), b.size()) / elem_size;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i * elem_size], &b[i * elem_size], elem_size) != 0 && diff++ == 0) first = i;
  const bool ok = a.size() == b.size() && diff == 0;
  std::string line = fmt("[gpu] %-64s bitwise %s", label.c_str(), ok ? "equal ok" : "FAIL");
  if (a.size() != b.size()) line += fmt(" (sizes %zu vs %zu bytes)", a.size(), b.size());
  if (diff) line += fmt(": %zu of %zu elements differ, first at %zu", diff, n, first);
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  return ok;
}
inline bool same_floats(const std::string& label, const std::vector<float>& a,
                        const std::vector<float>& b) {
  std::vector<uint8_t> ba(a.size() * 4), bb(b.size() * 4);
  std::memcpy(ba.data(), a.data(), ba.size());
  std::memcpy(bb.data(), b.data(), bb.size());
  return same_bits(label, ba, bb, 4);
}
inline bool same_ints(const std::string& label, const std::vector<int32_t>& gpu,
                      const std::vector<int32_t>& cpu) {
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i)
    if (gpu[i] != cpu[i] && diff++ == 0) first = i;
  const bool ok = gpu.size() == cpu.size() && diff == 0;
  std::string line = fmt("[gpu] %-64s exact %s", label.c_str(), ok ? "equal ok" : "FAIL");
  if (gpu.size() != cpu.size()) line += fmt(" (sizes %zu vs %zu)", gpu.size(), cpu.size());
  if (diff)
    line += fmt(": %zu of %zu differ, first at %zu: gpu %d cpu %d", diff, cpu.size(), first,
                gpu[first], cpu[first]);
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  return ok;
}
// Exact equality of values (bit for bit, -0 != +0), except that any NaN
// equals any NaN: NaN payloads are not part of any op's contract.
inline bool same_values(const std::string& label, const std::vector<float>& got,
                        const std::vector<float>& expected) {
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(expected[i]);
    if (!both_nan && std::memcmp(&got[i], &expected[i], 4) != 0 && diff++ == 0) first = i;
  }
  const bool ok = got.size() == expected.size() && diff == 0;
  std::string line = fmt("[gpu] %-64s exact %s", label.c_str(), ok ? "equal ok" : "FAIL");
  if (got.size() != expected.size())
    line += fmt(" (sizes %zu vs %zu)", got.size(), expected.size());
  if (diff)
    line += fmt(": %zu of %zu differ, first at %zu: gpu %.9g expected %.9g", diff, expected.size(),
                first, double(got[first]), double(expected[first]));
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  return ok;
}

// The largest elementwise |gpu - cpu| against an absolute bound, for errors
// that a norm would average away (a few wrong elements among many).
inline bool max_abs_within(const std::string& label, const std::vector<float>& gpu,
                           const std::vector<float>& cpu, double bound) {
  double m = gpu.size() == cpu.size() ? 0.0 : kInf;
  size_t worst = 0;
  for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
    const double d = std::fabs(double(gpu[i]) - double(cpu[i]));
    if (!(d <= m)) {  // NaN counts as the worst
      m = std::isnan(d) ? kInf : d;
      worst = i;
    }
  }
  const bool ok = m <= bound;
  std::string line =
      fmt("[gpu] %-64s max_abs=%.3e bound=%.1e %s", label.c_str(), m, bound, ok ? "ok" : "FAIL");
  if (!ok && worst < gpu.size() && worst < cpu.size())
    line += fmt(" (at %zu: gpu %.7g cpu %.7g)", worst, double(gpu[worst]), double(cpu[worst]));
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  return ok;
}

inline double l2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double(x) * double(x);
  return std::sqrt(s);
}

// Every value in [begin, end) of v is exactly 0 (NaN is not).
inline bool all_zero(const std::string& label, const std::vector<float>& v, size_t begin,
                     size_t end) {
  size_t bad = 0, first = 0;
  for (size_t i = begin; i < end && i < v.size(); ++i)
    if (!(v[i] == 0.f) && bad++ == 0) first = i;
  const bool ok = bad == 0 && end <= v.size();
  std::string line = fmt("[gpu] %-64s zeros %s", label.c_str(), ok ? "ok" : "FAIL");
  if (bad)
    line +=
        fmt(": %zu of %zu nonzero, first at %zu = %g", bad, end - begin, first, double(v[first]));
  std::printf("%s\n", line.c_str());
  INFO(line);
  CHECK(ok);
  return ok;
}

// Runs one configuration; an exception (an op rejecting its arguments, a CUDA
// error) fails this configuration with its message and lets the next run.
inline void run_case(const std::string& label, const std::function<void()>& body) {
  if (!g_device_broken.empty()) {
    std::printf("[gpu] %-64s NOT RUN: the device is unusable since: %s\n", label.c_str(),
                g_device_broken.c_str());
    FAIL_CHECK(label << ": not run, the device is unusable since: " << g_device_broken);
    return;
  }
  try {
    body();
  } catch (const std::exception& e) {
    std::printf("[gpu] %-64s FAIL: threw: %s\n", label.c_str(), e.what());
    FAIL_CHECK(label << ": threw: " << e.what());
    if (g_device_broken.empty() && device_unusable()) g_device_broken = label + ": " + e.what();
  }
}

inline const char* dn(DType dt) { return dtype_name(dt); }

}  // namespace trainer::gputest
