// The PTX probe: every instruction the kernels issue by hand (kernels/cuda/
// ptx.cuh) and the warp builtins they use, run once on deterministic inputs,
// each output value printed as `<probe> <index> <hex bits>`. Built twice
// (tests/CMakeLists.txt): `ptx_probe` by nvcc for a real GPU, `ptx_probe_emu`
// by the host compiler for the emulated device. The emulator's output travels
// to the first GPU lent (scripts/gpu_deps_bundle.sh -> gpu_deps/ptx_probe_emu.txt)
// and `ptx_probe --expect` there says where the emulator and the GPU differ
// (scripts/gpu-check.sh); both builds also check their output against the
// ISA as read on the host (probe_reference.cpp).
//
//   ptx_probe                 # the table on stdout, the reference verdicts on stderr
//   ptx_probe --expect FILE   # also compares with FILE (the other build's output)
//
// Exit: 0 all good; 1 a reference is WRONG or --expect found a mismatch;
// 2 bad arguments or an unreadable FILE; 3 a CUDA error (named).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "tests/ptx_probe/probe.h"
#include "tests/ptx_probe/probe_kernels.cuh"

namespace ptx_probe {
namespace {

using trainer::cuda::launch;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "ptx_probe: %s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  std::exit(3);
}
// A launch's own error, then the kernel's (every probe waits for its kernel).
void check_kernel(const char* kernel) {
  check(cudaGetLastError(), kernel);
  check(cudaDeviceSynchronize(), kernel);
}

template <typename T>
T* upload(const std::vector<T>& host) {
  void* p = nullptr;
  check(cudaMalloc(&p, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  return static_cast<T*>(p);
}

// `n` zero words on the device.
uint32_t* device_words(size_t n) {
  void* p = nullptr;
  check(cudaMalloc(&p, n * 4), "cudaMalloc");
  check(cudaMemset(p, 0, n * 4), "cudaMemset");
  return static_cast<uint32_t*>(p);
}

std::vector<uint32_t> download(const void* device, size_t n) {
  std::vector<uint32_t> host(n);
  check(cudaMemcpy(host.data(), device, n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  return host;
}

void release(const void* p) { check(cudaFree(const_cast<void*>(p)), "cudaFree"); }

Values as_values(const std::vector<uint32_t>& words, size_t first = 0, size_t n = size_t(-1)) {
  Values v;
  for (size_t i = 0; i < n && first + i < words.size(); ++i) v[uint32_t(i)] = words[first + i];
  return v;
}

template <typename T>
void run_mma(Table& t, const char* name, Type16 type, bool integers) {
  const uint32_t* in = upload(mma_inputs(type, integers));
  uint32_t* out = device_words(kLanes * 4);
  launch(mma_kernel<T>, dim3(1), dim3(kLanes), 0, nullptr, in, out);
  check_kernel(name);
  t[name] = as_values(download(out, kLanes * 4));
  release(in);
  release(out);
}

void run_ldmatrix(Table& t) {
  const uint32_t* rows = upload(ldmatrix_rows());
  uint32_t* out = device_words(kLdsmConfigs * kLanes * 4);
  launch(ldmatrix_kernel, dim3(1), dim3(kLanes), size_t(kLdsmRows) * 16, nullptr, rows, out);
  check_kernel("ldmatrix_kernel");
  const std::vector<uint32_t> r = download(out, kLdsmConfigs * kLanes * 4);
  const char* names[kLdsmConfigs] = {"ldmatrix_x4", "ldmatrix_x4_trans", "ldmatrix_x4_scattered",
                                     "ldmatrix_x4_trans_scattered"};
  for (int c = 0; c < kLdsmConfigs; ++c) t[names[c]] = as_values(r, size_t(c) * kLanes * 4, kLanes * 4);
  release(rows);
  release(out);
}

void run_cp_async(Table& t) {
  const uint32_t* src = upload(cp_async_source());
  uint32_t* wait1 = device_words(kLanes * 8);
  uint32_t* all = device_words(kCpChunks * 4);
  launch(cp_async_kernel, dim3(1), dim3(kLanes), size_t(kCpChunks) * 16, nullptr, src, wait1, all);
  check_kernel("cp_async_kernel");
  t["cp_async_wait1"] = as_values(download(wait1, kLanes * 8));
  t["cp_async_wait0"] = as_values(download(all, kCpChunks * 4));
  release(src);
  release(wait1);
  release(all);
}

void run_ex2(Table& t) {
  const std::vector<float> x = ex2_inputs();
  const int n = int(x.size());
  const float* in = upload(x);
  uint32_t* out = device_words(x.size());
  launch(ex2_kernel, dim3((n + 255) / 256), dim3(256), 0, nullptr, in, out, n);
  check_kernel("ex2_kernel");
  t["ex2_approx_ftz"] = as_values(download(out, x.size()));
  release(in);
  release(out);
}

// Word 1 of a lane is printed only for the 64-bit cases; the index is
// (case within its probe * 32 + lane) * 2 + word.
void run_shfl(Table& t) {
  const auto& named = shfl_cases();
  std::vector<ShflCase> cases;
  for (const NamedShflCase& c : named) cases.push_back(c.c);
  const ShflCase* dev_cases = upload(cases);
  const uint32_t* vals = upload(shfl_values());
  uint32_t* out = upload(std::vector<uint32_t>(cases.size() * kLanes * 2, kShflUntouched));
  launch(shfl_kernel, dim3(1), dim3(kLanes), 0, nullptr, dev_cases, int(cases.size()), vals, out);
  check_kernel("shfl_kernel");
  const std::vector<uint32_t> r = download(out, cases.size() * kLanes * 2);
  std::map<std::string, uint32_t> seen;
  for (size_t c = 0; c < cases.size(); ++c) {
    const uint32_t n = seen[named[c].probe]++;
    Values& v = t[named[c].probe];
    for (uint32_t lane = 0; lane < uint32_t(kLanes); ++lane)
      for (uint32_t w = 0; w < (cases[c].type == kU64 ? 2u : 1u); ++w)
        v[(n * kLanes + lane) * 2 + w] = r[(c * kLanes + lane) * 2 + w];
  }
  release(dev_cases);
  release(vals);
  release(out);
}

void run_barrier(Table& t) {
  const uint32_t* in = upload(barrier_inputs());
  uint32_t* out = device_words(kBarrierThreads);
  launch(barrier_kernel, dim3(1), dim3(kBarrierThreads), 0, nullptr, in, out);
  check_kernel("barrier_kernel");
  t["block_barrier"] = as_values(download(out, kBarrierThreads));
  release(in);
  release(out);
}

void run_atomics(Table& t) {
  uint32_t* words = device_words(kAtomicInts + kAtomicFloats);  // zeros: int 0 and +0.0f
  launch(atomic_kernel, dim3(kAtomicBlocks), dim3(kAtomicThreads), 0, nullptr, reinterpret_cast<int*>(words),
         reinterpret_cast<float*>(words + kAtomicInts));
  check_kernel("atomic_kernel");
  t["atomic_add"] = as_values(download(words, kAtomicInts + kAtomicFloats));
  release(words);
}

std::string device_header() {
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
#ifdef TRAINER_CUDA_EMU
  const char* build = "ptx_probe_emu (host compiler, emulated device)";
#else
  const char* build = "ptx_probe (nvcc)";
#endif
  return std::string(build) + " on " + p.name + ", sm_" + std::to_string(p.major) + std::to_string(p.minor);
}

int run(const char* expect) {
  const std::string header = device_header();
  Table t;
  run_mma<__nv_bfloat16>(t, "mma_bf16_int", Type16::kBf16, true);
  run_mma<__half>(t, "mma_f16_int", Type16::kF16, true);
  run_mma<__nv_bfloat16>(t, "mma_bf16_rand", Type16::kBf16, false);
  run_mma<__half>(t, "mma_f16_rand", Type16::kF16, false);
  run_ldmatrix(t);
  run_cp_async(t);
  run_ex2(t);
  run_shfl(t);
  run_barrier(t);
  run_atomics(t);
  print_table(t, header);
  std::string report;
  const bool refs_ok = check_references(t, report);
  bool same = true;
  if (expect) {
    Table want;
    std::string error;
    if (!read_table(expect, want, error)) {
      std::fprintf(stderr, "%sptx_probe --expect: %s\n", report.c_str(), error.c_str());
      return 2;
    }
    same = compare_tables(t, want, expect, report);
  }
  std::fputs(report.c_str(), stderr);
  if (!refs_ok) std::fputs("ptx_probe: a reference is WRONG: the device disagrees with the ISA as read here\n", stderr);
  return refs_ok && same ? 0 : 1;
}

}  // namespace
}  // namespace ptx_probe

int main(int argc, char** argv) {
  const char* expect = nullptr;
  if (argc == 3 && std::strcmp(argv[1], "--expect") == 0) {
    expect = argv[2];
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--expect FILE]   (FILE: an earlier output of the other build)\n", argv[0]);
    return 2;
  }
  return ptx_probe::run(expect);
}
