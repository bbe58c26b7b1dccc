// fma_peak: the CPU's fp32 multiply-add ceiling, the rate no GEMM can pass.
//
//   build/bench/fma_peak [threads]     (default: all cores)
//
// Each thread runs 12 independent chains of 8-wide AVX2 FMAs (enough to hide
// the FMA latency behind both pipes on current x86 cores) and reports
// GFLOP/s (2 per lane per FMA). docs/PERFORMANCE.md sets OpenBLAS's sgemm
// rate against it. x86-64 with AVX2 and FMA only; elsewhere it says so.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace {

constexpr int kChains = 12;

__attribute__((target("avx2,fma"))) double chains_gflops(long iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + float(c) * 1e-7f);
  const __m256 mul = _mm256_set1_ps(0.9999999f), add = _mm256_set1_ps(1e-7f);
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float sink = 0;
  for (int c = 0; c < kChains; ++c) sink += _mm256_cvtss_f32(acc[c]);
  if (sink == 0.123f) std::puts("");  // keeps the chains alive
  return double(iterations) * kChains * 8 * 2 / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::fprintf(stderr, "fma_peak: this CPU has no AVX2+FMA; nothing to measure\n");
    return 2;
  }
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_num_procs();
  if (threads < 1) {
    std::fprintf(stderr, "fma_peak: threads '%s': want a positive count\n", argv[1]);
    return 2;
  }
  // The best of three rounds (this machine's speed drifts); threads run at once within a round.
  std::vector<double> best;
  double best_total = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<double> rate(size_t(threads), 0.0);
#pragma omp parallel num_threads(threads)
    rate[size_t(omp_get_thread_num())] = chains_gflops(100'000'000);
    double total = 0;
    for (double r : rate) total += r;
    if (total > best_total) best_total = total, best = rate;
  }
  for (int t = 0; t < threads; ++t) std::printf("thread %d: %.1f GFLOP/s\n", t, best[size_t(t)]);
  const double total = best_total;
  std::printf("fp32 FMA peak, %d threads: %.1f GFLOP/s\n", threads, total);
}
#else
int main() {
  std::fprintf(stderr, "fma_peak: measures x86-64 AVX2+FMA only\n");
  return 2;
}
#endif
