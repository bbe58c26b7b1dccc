// The emulated CUDA runtime (emu/runtime_*.cpp) and the emulated branches of
// the module's three seams (kernels/cuda/launch.cuh, ptx.cuh,
// shared_memory.cuh), compiled as the emulated module is: by the host
// compiler, TRAINER_CUDA_EMU, emu/cuda_shim first on the include path
// (emu/cuda_module.cmake builds this program; not part of unit_tests, whose
// sources see no CUDA header). The kernels here are written as module code
// is, so what passes here is what the module's kernels get.
//
// Sticky errors last for the process, as on a GPU: the tests that cause one
// run in a forked child.
#define CATCH_CONFIG_MAIN
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/shared_memory.cuh"
#include "emu/sanitizers.h"

using trainer::cuda::launch;

namespace {

__global__ void iota_kernel(int* out, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = 3 * i;
}

// A warp sum by shuffles, the warps' partials through static shared memory,
// a barrier, and an atomic count of the threads that ran.
__global__ void block_sum_kernel(const float* in, float* out, unsigned* threads_ran) {
  TRAINER_SHARED(float, partial, [32]);
  float v = in[blockIdx.x * blockDim.x + threadIdx.x];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
  atomicAdd(threads_ran, 1u);
}

__global__ void reverse_kernel(int* out) {
  TRAINER_DYNAMIC_SHARED(int, buf, 16);
  buf[threadIdx.x] = int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = buf[blockDim.x - 1 - threadIdx.x];
}

// One warp: A (16x16, row-major) and B^T (8x16: B's columns as rows) copied
// to shared memory by cp.async, loaded by ldmatrix, multiplied by mma.sync.
__global__ void mma_kernel(const __nv_bfloat16* a, const __nv_bfloat16* bt, float* d) {
  TRAINER_DYNAMIC_SHARED(unsigned char, smem, 16);
  auto* as = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* bs = as + 16 * 16;
  const int lane = int(threadIdx.x);
  trainer::cuda::cp_async_16(as + lane * 8, a + lane * 8, true);  // 32 x 16 bytes: A
  if (lane < 16) trainer::cuda::cp_async_16(bs + lane * 8, bt + lane * 8, true);  // 16 x 16 bytes: B^T
  trainer::cuda::cp_async_commit();
  trainer::cuda::cp_async_wait<0>();
  __syncthreads();
  // Matrix m = lane / 8: A's quadrants in a0..a7 order (rows +8 first, then columns +8).
  const int m = lane / 8, r = lane % 8;
  uint32_t af[4], bf[4];
  trainer::cuda::ldsm_x4(af, as + (r + 8 * (m % 2)) * 16 + 8 * (m / 2));
  // B^T's two 8x8 halves (k 0-7, k 8-15), each given twice.
  trainer::cuda::ldsm_x4(bf, bs + r * 16 + 8 * (m % 2));
  float c[4] = {0, 0, 0, 0};
  trainer::cuda::mma_16816<__nv_bfloat16>(c, af, bf[0], bf[1]);
  const int g = lane / 4, t = lane % 4;
  d[g * 8 + 2 * t] = c[0];
  d[g * 8 + 2 * t + 1] = c[1];
  d[(g + 8) * 8 + 2 * t] = c[2];
  d[(g + 8) * 8 + 2 * t + 1] = c[3];
}

__global__ void write_past_end_kernel(int* p, int n) {
  if (threadIdx.x == 0) p[n] = 7;
}

__global__ void half_warp_shuffle_kernel(int* out) {
  // Lanes 16-31 are named in the mask but never call: a bad mask.
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1);
}

template <typename T>
std::vector<T> download(const T* device, size_t n) {
  std::vector<T> host(n);
  REQUIRE(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return host;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, host.size() * sizeof(T)) == cudaSuccess);
  REQUIRE(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return static_cast<T*>(p);
}

// Runs `body` in a forked child; its exit status (0: every check held).
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST_CASE("the emulated device reports H100 properties and says it is the CPU", "[emu_runtime]") {
  int n = 0;
  REQUIRE(cudaGetDeviceCount(&n) == cudaSuccess);
  REQUIRE(n == 1);
  cudaDeviceProp p{};
  REQUIRE(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
  CHECK(std::string(p.name).find("Emulated") != std::string::npos);
  CHECK(std::string(p.name).find("CPU") != std::string::npos);
  CHECK(p.major == 9);
  CHECK(p.minor == 0);
  CHECK(p.multiProcessorCount == 132);
  CHECK(p.sharedMemPerBlock == 48 * 1024);
  CHECK(p.sharedMemPerBlockOptin == 227 * 1024);
  CHECK(p.totalGlobalMem > 0);
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  CHECK(sms == 132);
  CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("device memory: fresh bytes are garbage, copies stay inside their allocation", "[emu_runtime]") {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, 100) == cudaSuccess);
  const std::vector<unsigned char> fresh = download(static_cast<unsigned char*>(p), 100);
  CHECK(fresh[0] == 0xFF);
  CHECK(fresh[99] == 0xFF);
  std::vector<unsigned char> host(101, 1);
  CHECK(cudaMemcpy(p, host.data(), 100, cudaMemcpyHostToDevice) == cudaSuccess);
  CHECK(cudaMemcpy(p, host.data(), 101, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("past the end") != std::string::npos);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaMemsetAsync(host.data(), 0, 4, nullptr) == cudaErrorInvalidValue);  // not device memory
  CHECK(cudaFree(static_cast<char*>(p) + 4) == cudaErrorInvalidValue);        // not an allocation's start
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaFree(p) == cudaErrorInvalidValue);  // twice
  cudaGetLastError();
}

TEST_CASE("streams and events run in order and keep their handles honest", "[emu_runtime]") {
  cudaStream_t s = nullptr;
  cudaEvent_t a = nullptr, b = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreate(&a) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&b, cudaEventDisableTiming) == cudaSuccess);
  CHECK(cudaEventRecord(a, s) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(nullptr, a, 0) == cudaSuccess);
  CHECK(cudaEventSynchronize(a) == cudaSuccess);
  float ms = -1;
  CHECK(cudaEventElapsedTime(&ms, a, a) == cudaSuccess);
  CHECK(ms == 0.0f);
  CHECK(cudaEventElapsedTime(&ms, a, b) == cudaErrorInvalidResourceHandle);  // b has no timing
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaEventDestroy(b) == cudaSuccess);
  CHECK(cudaEventDestroy(a) == cudaSuccess);
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);  // destroyed
  cudaGetLastError();
}

TEST_CASE("launch() runs a kernel on every thread of the grid", "[emu_runtime]") {
  const int n = 1000;
  int* out = nullptr;
  REQUIRE(cudaMalloc(&out, n * sizeof(int)) == cudaSuccess);
  launch(iota_kernel, (n + 127) / 128, 128, 0, nullptr, out, n);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<int> got = download(out, n);
  for (int i = 0; i < n; ++i) REQUIRE(got[i] == 3 * i);
  cudaFree(out);
}

TEST_CASE("shuffles, static shared memory, barriers and atomics", "[emu_runtime]") {
  const unsigned blocks = 3, threads = 128;
  std::vector<float> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 7);
  float* d_in = upload(in);
  float* d_out = upload(std::vector<float>(blocks, 0));
  unsigned* d_count = upload(std::vector<unsigned>(1, 0));
  launch(block_sum_kernel, blocks, threads, 0, nullptr, d_in, d_out, d_count);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<float> out = download(d_out, blocks);
  for (unsigned b = 0; b < blocks; ++b) {
    float want = 0;
    for (unsigned t = 0; t < threads; ++t) want += in[b * threads + t];
    CHECK(out[b] == want);
  }
  CHECK(download(d_count, 1)[0] == blocks * threads);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_count);
}

TEST_CASE("dynamic shared memory above 48 KiB needs the opt-in, as on a GPU", "[emu_runtime]") {
  int* out = nullptr;
  REQUIRE(cudaMalloc(&out, 64 * sizeof(int)) == cudaSuccess);
  const size_t big = 64 * 1024;
  launch(reverse_kernel, 1, 64, big, nullptr, out);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(std::string(cudaGetErrorString(cudaErrorInvalidValue)).find("cudaFuncSetAttribute") != std::string::npos);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  REQUIRE(cudaFuncSetAttribute(reverse_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(big)) == cudaSuccess);
  launch(reverse_kernel, 1, 64, big, nullptr, out);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<int> got = download(out, 64);
  for (int i = 0; i < 64; ++i) CHECK(got[i] == 63 - i);
  launch(reverse_kernel, 1, 2048, 0, nullptr, out);  // more threads than a block may have
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  cudaFree(out);
}

TEST_CASE("ptx.cuh: cp.async, ldmatrix and mma.sync compute A*B", "[emu_runtime]") {
  // Small integers over 8: exact in bf16, and every sum exact in float.
  std::vector<__nv_bfloat16> a(16 * 16), bt(8 * 16);
  std::vector<float> af(a.size()), btf(bt.size());
  for (size_t i = 0; i < a.size(); ++i) af[i] = float(int(i * 7 % 17) - 8) / 8.0f;
  for (size_t i = 0; i < bt.size(); ++i) btf[i] = float(int(i * 5 % 13) - 6) / 8.0f;
  for (size_t i = 0; i < a.size(); ++i) a[i] = __float2bfloat16(af[i]);
  for (size_t i = 0; i < bt.size(); ++i) bt[i] = __float2bfloat16(btf[i]);
  __nv_bfloat16* d_a = upload(a);
  __nv_bfloat16* d_bt = upload(bt);
  float* d_d = upload(std::vector<float>(16 * 8, -1));
  launch(mma_kernel, 1, 32, (16 * 16 + 8 * 16) * sizeof(__nv_bfloat16), nullptr, d_a, d_bt, d_d);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  const std::vector<float> d = download(d_d, 16 * 8);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      float want = 0;
      for (int k = 0; k < 16; ++k) want += af[i * 16 + k] * btf[j * 16 + k];
      CHECK(d[i * 8 + j] == want);
    }
  CHECK(trainer::cuda::fast_exp2(3.0f) == 8.0f);
  cudaFree(d_a);
  cudaFree(d_bt);
  cudaFree(d_d);
}

// Under AddressSanitizer the guard zones are poisoned: the write is reported
// at the access, in the kernel, and ASan ends the process (exit 42 from its
// death callback says it was ASan). Without it the emulator finds the damaged
// guard after the kernel.
constexpr int kAsanReported = 42;

TEST_CASE("a write past an allocation's end is a sticky illegal address naming the kernel", "[emu_runtime]") {
  const int status = in_child([] {
#if defined(TRAINER_EMU_ASAN)
    __sanitizer_set_death_callback([] { ::_exit(kAsanReported); });
    // The expected report stays out of the log that scripts/sanitize_ci.sh
    // reads for unexpected ones.
    const int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0) ::dup2(null, 2);
#endif
    int* p = nullptr;
    if (cudaMalloc(&p, 16 * sizeof(int)) != cudaSuccess) return 1;
    launch(write_past_end_kernel, 1, 32, 0, nullptr, p, 16);
    if (cudaGetLastError() != cudaErrorIllegalAddress) return 2;
    const std::string text = cudaGetErrorString(cudaErrorIllegalAddress);
    if (text.find("write_past_end_kernel") == std::string::npos || text.find("past the end") == std::string::npos)
      return 3;
    if (cudaDeviceSynchronize() != cudaErrorIllegalAddress) return 4;  // sticky
    if (cudaGetLastError() != cudaErrorIllegalAddress) return 5;       // not cleared either
    return 0;
  });
#if defined(TRAINER_EMU_ASAN)
  CHECK(status == kAsanReported);
#else
  CHECK(status == 0);
#endif
}

TEST_CASE("an error inside a kernel is a sticky launch failure with the emulator's message", "[emu_runtime]") {
  const int status = in_child([] {
    int* out = nullptr;
    if (cudaMalloc(&out, 32 * sizeof(int)) != cudaSuccess) return 1;
    launch(half_warp_shuffle_kernel, 1, 32, 0, nullptr, out);
    if (cudaGetLastError() != cudaErrorLaunchFailure) return 2;
    if (std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("half_warp_shuffle_kernel") == std::string::npos)
      return 3;
    launch(iota_kernel, 1, 32, 0, nullptr, out, 32);  // refused: the context is gone
    if (cudaGetLastError() != cudaErrorLaunchFailure) return 4;
    if (cudaMemset(out, 0, 4) != cudaErrorLaunchFailure) return 5;
    return 0;
  });
  CHECK(status == 0);
}
