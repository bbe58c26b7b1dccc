#include "kernels/cpu/blas_core.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

// OpenBLAS's Fortran entry point: the check goes through it, not cblas_sgemm,
// so it stays out of the per-step timing bench/blas_time.cpp takes of every
// cblas_sgemm call; both reach the same kernels.
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace trainer::cpu {

namespace {

constexpr const char* kPicked = "TRAINER_BLAS_CORE_PICKED";      // what OpenBLAS had picked
constexpr const char* kSet = "TRAINER_BLAS_CORE_SET";            // the core we asked for
constexpr const char* kRejected = "TRAINER_BLAS_CORE_REJECTED";  // why it was taken back
// A wrong kernel is off by O(1); fp32 rounding over K=200 stays under 2e-5.
constexpr double kMaxError = 1e-4;

double g_check_error = -1;  // the check this process ran, -1 none

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "";
}

const char* level_words(int level) {
  switch (level) {
    case 3: return "AVX-512";
    case 2: return "AVX2 and FMA";
    case 1: return "AVX";
    default: return "SSE";
  }
}

// Deterministic values in [-1, 1): the check must not depend on a seed.
void fill(std::vector<float>& v, uint32_t state) {
  for (float& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
}

// Largest |C - reference| relative to sum_k |a_ik b_kj| for one column-major
// product C (M x N) = op(A) op(B), A stored M x K (K x M transposed), B K x N
// (N x K transposed).
double product_error(SgemmFn sgemm, int M, int N, int K, bool ta, bool tb) {
  std::vector<float> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(K) * N), c(static_cast<size_t>(M) * N);
  fill(a, 12345u + M);
  fill(b, 67890u + N);
  const float one = 1.0f, zero = 0.0f;
  const int lda = ta ? K : M, ldb = tb ? N : K;
  sgemm(ta ? "T" : "N", tb ? "T" : "N", &M, &N, &K, &one, a.data(), &lda, b.data(), &ldb, &zero, c.data(), &M);
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double sum = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double x = ta ? a[static_cast<size_t>(i) * K + k] : a[static_cast<size_t>(k) * M + i];
        const double y = tb ? b[static_cast<size_t>(k) * N + j] : b[static_cast<size_t>(j) * K + k];
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double err = std::fabs(c[static_cast<size_t>(j) * M + i] - sum) / std::max(mag, 1e-30);
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
  return worst;
}

}  // namespace

CpuFeatures cpu_features() {
  CpuFeatures f;
  __builtin_cpu_init();
  // libgcc's checks include the OS saving the AVX and AVX-512 registers.
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.amd = __builtin_cpu_is("amd");
  f.model = cpu_model();
  return f;
}

int blas_core_level(const std::string& core) {
  // OpenBLAS 0.3's DYNAMIC_ARCH x86-64 cores by the widest vectors they use.
  static const std::vector<std::pair<std::string_view, int>> kCores = {
      {"sapphirerapids", 3}, {"cooperlake", 3}, {"skylakex", 3},
      {"haswell", 2},        {"zen", 2},
      {"sandybridge", 1},    {"bulldozer", 1},  {"piledriver", 1}, {"steamroller", 1}, {"excavator", 1},
      {"katmai", 0},         {"coppermine", 0}, {"northwood", 0},  {"prescott", 0},    {"banias", 0},
      {"core2", 0},          {"penryn", 0},     {"dunnington", 0}, {"nehalem", 0},     {"atom", 0},
      {"athlon", 0},         {"opteron", 0},    {"opteron_sse3", 0}, {"barcelona", 0}, {"bobcat", 0},
      {"nano", 0}};
  const std::string name = lower(core);
  for (const auto& [n, level] : kCores)
    if (name == n) return level;
  return -1;
}

std::string best_blas_core(const CpuFeatures& cpu) {
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return cpu.amd ? "Zen" : "Haswell";
  if (cpu.avx) return "Sandybridge";
  return "";
}

std::string better_blas_core(const CpuFeatures& cpu, const std::string& picked) {
  const std::string best = best_blas_core(cpu);
  const int level = blas_core_level(picked);
  if (best.empty() || level < 0 || level >= blas_core_level(best)) return "";
  return best;
}

std::string blas_core_name() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

std::string core_to_request(const CpuFeatures& cpu, const std::string& picked, const std::string& user_setting) {
  if (!user_setting.empty()) return "";
  return better_blas_core(cpu, picked);
}

std::string core_check_verdict(const std::string& asked, const std::string& runs, double check_error) {
  if (lower(runs) != lower(asked)) return asked + " was asked for but OpenBLAS runs " + runs;
  if (check_error <= kMaxError) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s failed the sgemm check (largest relative error %.2g, limit %.0g)",
                asked.c_str(), check_error, kMaxError);
  return buf;
}

bool choose_blas_core() {
  // A core taken back after its check is not asked for again.
  if (std::getenv(kRejected)) return false;
  const std::string picked = blas_core_name();
  const std::string better = core_to_request(cpu_features(), picked, env("OPENBLAS_CORETYPE"));
  if (better.empty()) return false;
  ::setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  ::setenv(kSet, better.c_str(), 1);
  ::setenv(kPicked, picked.c_str(), 1);
  return true;
}

void wrong_sgemm_standin(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                         const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                         const float* beta, float* c, const int* ldc) {
  const int shorter = *k - 1;
  sgemm_(transa, transb, m, n, &shorter, alpha, a, lda, b, ldb, beta, c, ldc);
}

double sgemm_check_error(SgemmFn sgemm) {
  if (!sgemm) sgemm = sgemm_;
  // The linears' three products (row-major x W^T, dY W, dY^T x are, column-
  // major, TN, NN and NT), at sizes that are no multiple of the kernels' blocks.
  double worst = 0;
  for (const auto& [m, n, k] : {std::tuple{37, 29, 67}, std::tuple{96, 130, 200}})
    for (const auto& [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
      worst = std::max(worst, product_error(sgemm, m, n, k, ta, tb));
  return worst;
}

bool reject_unverified_blas_core() {
  const std::string set = env(kSet);
  if (set.empty() || env("OPENBLAS_CORETYPE") != set) return false;  // not ours to check
  const std::string runs = blas_core_name();
  if (lower(runs) == lower(set))
    g_check_error = sgemm_check_error(env("TRAINER_TEST_BLAS_CHECK") == "wrong" ? wrong_sgemm_standin : nullptr);
  const std::string why = core_check_verdict(set, runs, g_check_error);
  if (why.empty()) return false;
  ::unsetenv("OPENBLAS_CORETYPE");
  ::unsetenv(kSet);
  ::setenv(kRejected, why.c_str(), 1);
  return true;
}

std::string blas_core_summary() {
  const std::string runs = blas_core_name();
  const std::string set = env(kSet), rejected = env(kRejected), user = env("OPENBLAS_CORETYPE");
  const CpuFeatures cpu = cpu_features();
  const std::string model = cpu.model.empty() ? "this CPU" : "'" + cpu.model + "'";
  if (!rejected.empty())
    return "core " + runs + ", OpenBLAS's choice for " + model + ": " + rejected +
           "; OPENBLAS_CORETYPE=NAME forces a core";
  if (!set.empty() && user == set) {
    char err[48] = "";
    if (g_check_error >= 0) std::snprintf(err, sizeof err, ", sgemm checked (error %.1g)", g_check_error);
    return "core " + runs + ", chosen for this CPU's " + level_words(blas_core_level(set)) + ": OpenBLAS picked " +
           env(kPicked) + " for " + model + err + "; OPENBLAS_CORETYPE=" + env(kPicked) +
           " keeps OpenBLAS's choice";
  }
  if (!user.empty()) return "core " + runs + ", OPENBLAS_CORETYPE=" + user;
  return "core " + runs + ", OpenBLAS's choice for " + model;
}

}  // namespace trainer::cpu
