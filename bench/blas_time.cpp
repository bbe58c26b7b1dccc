// libblas_time.so: times every cblas_sgemm of a CPU run, for LD_PRELOAD.
//
//   BLAS_TIME_OUT=gemm.json LD_PRELOAD=build/bench/libblas_time.so build/trainer --config run.yaml
//
// The trainer's CPU matmuls all go through cblas_sgemm (OpenBLAS), so the
// sum of their times is the part of a step that only a faster GEMM could
// shorten: scripts/bench_cpu.py --gemm-floor reads it as the step's floor.
// Each distinct call (transposes, M, N, K, beta zero or not, called inside
// an OpenMP parallel region or not) gets its call count, total and median
// seconds and every call's seconds in call order, so a reader that knows the
// step count can leave the warm-up steps (page faults) out. Calls inside a
// parallel region (attention's per-head GEMMs) are timed per thread, their
// order across threads is the order they finished in.
// At exit it writes one JSON object to $BLAS_TIME_OUT (stderr when unset).
// A measuring tool, not part of the trainer: it adds a clock read and a lock
// to every call, so runs under it are not timed for the table.
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace {

using Sgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, blasint, blasint, blasint, float,
                       const float*, blasint, const float*, blasint, float, float*, blasint);

// (transpose A, transpose B, M, N, K, beta != 0, inside a parallel region)
using Key = std::tuple<bool, bool, int, int, int, bool, bool>;

struct Log {
  std::mutex mu;
  std::map<Key, std::vector<double>> seconds;

  ~Log() {  // process exit: the run is over
    const char* path = std::getenv("BLAS_TIME_OUT");
    FILE* f = path ? std::fopen(path, "w") : stderr;
    if (!f) {
      std::fprintf(stderr, "blas_time: cannot write BLAS_TIME_OUT=%s\n", path);
      return;
    }
    std::fprintf(f, "{\"sgemm\": [");
    const char* sep = "";
    for (auto& [key, s] : seconds) {
      const auto [ta, tb, m, n, k, beta, parallel] = key;
      double total = 0;
      for (double x : s) total += x;
      std::vector<double> sorted = s;
      std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
      std::fprintf(f,
                   "%s\n {\"trans_a\": %s, \"trans_b\": %s, \"m\": %d, \"n\": %d, \"k\": %d, \"beta\": %s, "
                   "\"in_parallel\": %s, \"calls\": %zu, \"total_s\": %.9g, \"median_s\": %.9g, \"seconds\": [",
                   sep, ta ? "true" : "false", tb ? "true" : "false", m, n, k, beta ? "true" : "false",
                   parallel ? "true" : "false", s.size(), total, sorted[sorted.size() / 2]);
      for (size_t i = 0; i < s.size(); ++i) std::fprintf(f, "%s%.4g", i ? "," : "", s[i]);
      std::fprintf(f, "]}");
      sep = ",";
    }
    std::fprintf(f, "\n]}\n");
    if (path) std::fclose(f);
  }
};

Log& log() {
  static Log l;
  return l;
}

}  // namespace

extern "C" void cblas_sgemm(CBLAS_ORDER order, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, blasint M, blasint N,
                            blasint K, float alpha, const float* A, blasint lda, const float* B, blasint ldb,
                            float beta, float* C, blasint ldc) {
  static const Sgemm real = reinterpret_cast<Sgemm>(dlsym(RTLD_NEXT, "cblas_sgemm"));
  if (!real) {
    std::fprintf(stderr, "blas_time: no cblas_sgemm after this library (is a BLAS linked?)\n");
    std::abort();
  }
  Log& l = log();  // constructed before the first call returns, destroyed after main
  const auto t0 = std::chrono::steady_clock::now();
  real(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Key key{ta != CblasNoTrans, tb != CblasNoTrans, M, N, K, beta != 0.f, omp_in_parallel() != 0};
  std::lock_guard<std::mutex> lock(l.mu);
  l.seconds[key].push_back(s);
}
