// sgemm_libs: fp32 GEMM throughput of one BLAS library at the trainer's own
// linear-layer shapes, so OpenBLAS (what kernels/cpu/linear.cpp calls) can be
// set against BLIS and oneDNN. One source, three programs; the library is
// chosen at compile time (bench/CMakeLists.txt):
//
//   -DSGEMM_LIB_OPENBLAS  sgemm_openblas  cblas_sgemm (CblasRowMajor)
//   -DSGEMM_LIB_BLIS      sgemm_blis      bli_sgemm (BLIS's typed API, row/column
//                                         strides: BLIS itself whatever
//                                         libblas.so.3 points at)
//   -DSGEMM_LIB_ONEDNN    sgemm_onednn    dnnl_sgemm (row-major C API)
//
//   build/bench/sgemm_<lib> [--models quickstart,llama-d512,gpt2-124m]
//                           [--threads T] [--min-time S] [--batches B] [--quick]
//   build/bench/sgemm_<lib> --info          (the header and KERNEL line only)
//   build/bench/sgemm_blis --arch-id NAME   (prints BLIS's arch_t number for
//                                            NAME, for BLIS_ARCH_TYPE; 0.9 reads
//                                            a number, not a name)
//
// Per linear of a model (weight [out, in], N tokens) it times the three GEMMs
// of kernels/cpu/linear.cpp, with the same transposes, leading dimensions and
// betas:
//   forward  Y[N,out]   = X[N,in] * W[out,in]^T     (NoTrans, Trans,   beta 0)
//   dX       dX[N,in]   = dY[N,out] * W[out,in]     (NoTrans, NoTrans, beta 0)
//   dW       dW[out,in] += dY[N,out]^T * X[N,in]    (Trans,   NoTrans, beta 1)
// each 2*N*in*out flops.
//
// Timing: one checked call, then warm-up calls for >= 0.05 s, then B batches
// of R calls each (R sized from the warm-up so a batch takes >= S/B s); the
// rate reported is from the MEDIAN batch (the best batch is in the machine
// lines too). Operands stay the same across calls, so this is a warm-cache
// number. A model's totals are sum(flops) / sum(median times) over its
// linears as one training step has them (a block's linears times the
// model's layers, plus lm_head once), per product and over all three
// products: "all" is the number that decides.
//
// Correctness: once per shape and product, 4 corners + 60 random outputs
// against a double-precision dot product; error = |c - ref| / (sum_k |a*b| +
// |beta*c0|), which is the normwise-per-element measure that fp32 rounding
// bounds (a plain |c-ref|/|ref| blows up where the sum cancels). Above 1e-4 the
// program stops with exit status 3: a fast but wrong library must not win.
//
// Threads: all cores by default (omp_get_num_procs()), set explicitly:
// OpenBLAS openblas_set_num_threads, BLIS bli_thread_set_num_threads, oneDNN
// (OpenMP runtime, libgomp shared with this program) omp_set_num_threads.
//
// Output on stdout: '#' comment lines, tab-separated machine lines tagged
// KERNEL / RESULT / TOTAL (field names in the '#' header lines above them),
// then a human table.
#if (defined(SGEMM_LIB_OPENBLAS) + defined(SGEMM_LIB_BLIS) + defined(SGEMM_LIB_ONEDNN)) != 1
#error "define exactly one of SGEMM_LIB_OPENBLAS, SGEMM_LIB_BLIS, SGEMM_LIB_ONEDNN"
#endif

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#if defined(SGEMM_LIB_OPENBLAS)
#include <cblas.h>
#elif defined(SGEMM_LIB_BLIS)
#include <blis.h>
#elif defined(SGEMM_LIB_ONEDNN)
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#endif

namespace {

enum class Product { Forward, DX, DW };
constexpr Product kProducts[] = {Product::Forward, Product::DX, Product::DW};
const char* product_name(Product p) {
  switch (p) {
    case Product::Forward: return "forward";
    case Product::DX: return "dX";
    case Product::DW: return "dW";
  }
  return "?";
}

// One row-major GEMM in cblas terms: C[M,N] = alpha op(A) op(B) + beta C.
struct Gemm {
  bool ta, tb;
  int M, N, K;
  const float* A;
  int lda;
  const float* B;
  int ldb;
  float beta;
  float* C;
  int ldc;
};

#if defined(SGEMM_LIB_OPENBLAS)
const char* kLib = "openblas";
void sgemm(const Gemm& g) {
  cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
              g.M, g.N, g.K, 1.f, g.A, g.lda, g.B, g.ldb, g.beta, g.C, g.ldc);
}
#elif defined(SGEMM_LIB_BLIS)
const char* kLib = "blis";
// Row-major storage: row stride = leading dimension, column stride 1; the
// transposes are passed as flags, as cblas gets them.
void sgemm(const Gemm& g) {
  float alpha = 1.f, beta = g.beta;
  bli_sgemm(g.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
            g.M, g.N, g.K, &alpha, const_cast<float*>(g.A), g.lda, 1, const_cast<float*>(g.B),
            g.ldb, 1, &beta, g.C, g.ldc, 1);
}
#elif defined(SGEMM_LIB_ONEDNN)
const char* kLib = "onednn";
void sgemm(const Gemm& g) {
  const dnnl_status_t s = dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.M, g.N, g.K, 1.f, g.A,
                                     g.lda, g.B, g.ldb, g.beta, g.C, g.ldc);
  if (s != dnnl_success) {
    std::fprintf(stderr, "sgemm_onednn: dnnl_sgemm returned status %d\n", int(s));
    std::exit(4);
  }
}
#endif

// Element (i, j) of op(A) for a row-major A with leading dimension ld.
inline float at(const float* A, int ld, bool t, int i, int j) {
  return t ? A[int64_t(j) * ld + i] : A[int64_t(i) * ld + j];
}

struct Layer {
  const char* name;
  int out, in;
};
struct Model {
  const char* name;
  int tokens;  // N = micro-batch x sequence length
  int blocks;  // transformer layers: each block linear runs this often per step
  std::vector<Layer> layers;
};

// How often a linear runs in one step: the head once, a block's linears once per layer.
int per_step(const Model& m, const std::string& layer) { return layer == "lm_head" ? 1 : m.blocks; }

const std::vector<Model>& models() {
  static const std::vector<Model> m = {
      // llama, d_model 128, 4 heads / 2 kv heads, ffn 352, vocab 256, 16 x 128 tokens.
      {"quickstart",
       16 * 128,
       4,
       {{"wq", 128, 128},
        {"wk", 64, 128},
        {"wv", 64, 128},
        {"wo", 128, 128},
        {"w_gate", 352, 128},
        {"w_up", 352, 128},
        {"w_down", 128, 352},
        {"lm_head", 256, 128}}},
      // llama, d_model 512, 8 heads / 4 kv heads, ffn 1376, vocab 256, 8 x 256 tokens.
      {"llama-d512",
       8 * 256,
       8,
       {{"wq", 512, 512},
        {"wk", 256, 512},
        {"wv", 256, 512},
        {"wo", 512, 512},
        {"w_gate", 1376, 512},
        {"w_up", 1376, 512},
        {"w_down", 512, 1376},
        {"lm_head", 256, 512}}},
      // GPT-2 124M, d_model 768, vocab 50257, 2 x 256 tokens.
      {"gpt2-124m",
       2 * 256,
       12,
       {{"wq", 768, 768},
        {"wk", 768, 768},
        {"wv", 768, 768},
        {"wo", 768, 768},
        {"fc", 3072, 768},
        {"proj", 768, 3072},
        {"lm_head", 50257, 768}}},
  };
  return m;
}

// splitmix64: fast, reproducible fills in [-1, 1).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(double(next() >> 40) / double(1ull << 24) * 2.0 - 1.0); }
};

void fill(std::vector<float>& v, uint64_t seed) {
  Rng r{seed};
  for (float& x : v) x = r.uniform();
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

constexpr double kTolerance = 1e-4;

// One call on a fresh C (sentinel for beta 0, which must be overwritten; a
// known C0 for beta 1), checked at 64 outputs. Returns the worst error.
double check(const Gemm& g, uint64_t seed) {
  std::vector<float> c0(size_t(g.M) * size_t(g.ldc));
  if (g.beta == 0.f)
    std::fill(c0.begin(), c0.end(), 12345.f);
  else
    fill(c0, seed ^ 0xC0FFEEull);
  std::copy(c0.begin(), c0.end(), g.C);
  sgemm(g);
  std::vector<std::pair<int, int>> at_ij = {{0, 0}, {0, g.N - 1}, {g.M - 1, 0}, {g.M - 1, g.N - 1}};
  Rng r{seed};
  while (at_ij.size() < 64) at_ij.push_back({int(r.next() % uint64_t(g.M)), int(r.next() % uint64_t(g.N))});
  double worst = 0;
  for (auto [i, j] : at_ij) {
    double ref = 0, mag = 0;
    for (int k = 0; k < g.K; ++k) {
      const double p = double(at(g.A, g.lda, g.ta, i, k)) * double(at(g.B, g.ldb, g.tb, k, j));
      ref += p;
      mag += std::fabs(p);
    }
    const double cin = double(c0[size_t(i) * size_t(g.ldc) + size_t(j)]);
    ref += double(g.beta) * cin;
    mag += std::fabs(double(g.beta) * cin);
    const double got = double(g.C[int64_t(i) * g.ldc + j]);
    const double err = std::isfinite(got) ? std::fabs(got - ref) / std::max(mag, 1e-30) : INFINITY;
    worst = std::max(worst, err);
  }
  return worst;
}

struct Timing {
  int reps = 0;
  double median = 0, best = 0, cpu_util = 0;  // seconds per call; cpu/wall
};

Timing time_gemm(const Gemm& g, double min_time, int batches) {
  // Warm-up: >= 0.05 s and >= 2 calls; the last call sizes the batches.
  double t_call = 0;
  {
    const double t0 = now();
    int n = 0;
    double last = t0;
    while (n < 2 || last - t0 < 0.05) {
      const double a = now();
      sgemm(g);
      last = now();
      t_call = last - a;
      ++n;
    }
  }
  Timing t;
  const double per_batch = min_time / batches;
  t.reps = std::max(1, int(std::ceil(per_batch / std::max(t_call, 1e-9))));
  std::vector<double> per_call;
  const double w0 = now(), c0 = cpu_seconds();
  for (int b = 0; b < batches; ++b) {
    const double a = now();
    for (int r = 0; r < t.reps; ++r) sgemm(g);
    per_call.push_back((now() - a) / t.reps);
  }
  t.cpu_util = (cpu_seconds() - c0) / std::max(now() - w0, 1e-9);
  std::sort(per_call.begin(), per_call.end());
  t.best = per_call.front();
  const size_t n = per_call.size();
  t.median = n % 2 ? per_call[n / 2] : 0.5 * (per_call[n / 2 - 1] + per_call[n / 2]);
  return t;
}

void set_threads(int threads) {
  omp_set_num_threads(threads);
#if defined(SGEMM_LIB_OPENBLAS)
  openblas_set_num_threads(threads);
#elif defined(SGEMM_LIB_BLIS)
  bli_thread_set_num_threads(threads);
#endif
}

// The KERNEL line: which kernels and how many threads the library will run.
void print_kernels(int threads) {
  std::printf("# KERNEL\tlib\tkernel\tthreads\tthreading\tversion\tdetail\n");
#if defined(SGEMM_LIB_OPENBLAS)
  const int par = openblas_get_parallel();
  std::string cfg = openblas_get_config();
  while (!cfg.empty() && cfg.back() == ' ') cfg.pop_back();
  std::printf("KERNEL\topenblas\t%s\t%d\t%s\t%s\tOPENBLAS_CORETYPE=%s\n", openblas_get_corename(),
              openblas_get_num_threads(),
              par == 0 ? "serial" : par == 1 ? "pthread" : par == 2 ? "openmp" : "unknown",
              cfg.c_str(), std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "(unset)");
#elif defined(SGEMM_LIB_BLIS)
  const arch_t id = bli_arch_query_id();
  const char* threading = bli_info_get_enable_openmp()   ? "openmp"
                          : bli_info_get_enable_pthreads() ? "pthread"
                                                           : "serial";
  std::printf("KERNEL\tblis\t%s\t%ld\t%s\t%s\tarch_id=%d BLIS_ARCH_TYPE=%s\n", bli_arch_string(id),
              long(bli_thread_get_num_threads()), threading, bli_info_get_version_str(), int(id),
              std::getenv("BLIS_ARCH_TYPE") ? std::getenv("BLIS_ARCH_TYPE") : "(unset)");
#elif defined(SGEMM_LIB_ONEDNN)
  const dnnl_version_t* v = dnnl_version();
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  std::printf("KERNEL\tonednn\t%s\t%d\topenmp\t%d.%d.%d\tONEDNN_MAX_CPU_ISA=%s cpu_runtime=%u\n",
              dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa()), omp_get_max_threads(), v->major,
              v->minor, v->patch, cap ? cap : "(unset)", v->cpu_runtime);
#endif
  if (threads != omp_get_max_threads())
    std::printf("# note: omp_get_max_threads() = %d\n", omp_get_max_threads());
}

struct Row {
  std::string model, layer;
  Product product;
  int M, N, K;
  double flops;
  Timing t;
  double err;
};

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--models a,b] [--threads T] [--min-time S] [--batches B] [--quick] [--info]\n"
               "          models: quickstart, llama-d512, gpt2-124m (default all)\n"
               "          --threads: default all cores (%d)\n"
               "          --min-time: seconds of timed calls per shape and product (default 0.3)\n"
               "          --batches: batches those are split into; the median is reported (default 5)\n"
               "          --quick: --min-time 0.03 --batches 3 (checks the program, not the libraries)\n"
               "          --info: print which kernels and threads the library will use, and stop\n",
               argv0, omp_get_num_procs());
#if defined(SGEMM_LIB_BLIS)
  std::fprintf(stderr, "       %s --arch-id NAME: BLIS's number for sub-configuration NAME (BLIS_ARCH_TYPE)\n",
               argv0);
#endif
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_num_procs();
  double min_time = 0.3;
  int batches = 5;
  std::string want_models;
  bool info_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", argv[0], a.c_str());
        std::exit(usage(argv[0]));
      }
      return argv[++i];
    };
    if (a == "--threads") threads = std::atoi(value());
    else if (a == "--min-time") min_time = std::atof(value());
    else if (a == "--batches") batches = std::atoi(value());
    else if (a == "--models") want_models = value();
    else if (a == "--quick") min_time = 0.03, batches = 3;
    else if (a == "--info") info_only = true;
#if defined(SGEMM_LIB_BLIS)
    else if (a == "--arch-id") {
      const std::string name = value();
      for (int id = 0; id < int(BLIS_NUM_ARCHS); ++id)
        if (name == bli_arch_string(arch_t(id))) {
          std::printf("%d\n", id);
          return 0;
        }
      std::fprintf(stderr, "%s: BLIS knows no arch '%s'\n", argv[0], name.c_str());
      return 2;
    }
#endif
    else return usage(argv[0]);
  }
  if (threads < 1 || batches < 1 || !(min_time > 0)) return usage(argv[0]);

  std::vector<const Model*> run;
  for (const Model& m : models())
    if (want_models.empty() || ("," + want_models + ",").find("," + std::string(m.name) + ",") != std::string::npos)
      run.push_back(&m);
  if (run.empty()) {
    std::fprintf(stderr, "%s: no model matches '%s'\n", argv[0], want_models.c_str());
    return 2;
  }

  set_threads(threads);
  std::printf("# sgemm_%s: fp32 GEMM at the trainer's linear shapes (row-major, as kernels/cpu/linear.cpp)\n", kLib);
  std::printf("# threads %d (of %d cores), min-time %.3g s per shape/product in %d batches, median batch reported\n",
              threads, omp_get_num_procs(), min_time, batches);
  print_kernels(threads);
  std::fflush(stdout);
  if (info_only) return 0;

  std::printf("# RESULT\tlib\tmodel\tlayer\tproduct\tM\tN\tK\tgflop\treps\tbatches\tmedian_s\tbest_s"
              "\tgflops_median\tgflops_best\tcpu_util\tmax_rel_err\n");
  std::vector<Row> rows;
  uint64_t seed = 1;
  for (const Model* m : run) {
    for (const Layer& L : m->layers) {
      const int N = m->tokens, in = L.in, out = L.out;
      std::vector<float> X(size_t(N) * in), W(size_t(out) * in), Y(size_t(N) * out),
          dY(size_t(N) * out), dX(size_t(N) * in), dW(size_t(out) * in);
      fill(X, seed++);
      fill(W, seed++);
      fill(dY, seed++);
      for (Product p : kProducts) {
        Gemm g{};
        switch (p) {
          case Product::Forward:  // Y[N,out] = X[N,in] W[out,in]^T
            g = {false, true, N, out, in, X.data(), in, W.data(), in, 0.f, Y.data(), out};
            break;
          case Product::DX:  // dX[N,in] = dY[N,out] W[out,in]
            g = {false, false, N, in, out, dY.data(), out, W.data(), in, 0.f, dX.data(), in};
            break;
          case Product::DW:  // dW[out,in] += dY[N,out]^T X[N,in]
            g = {true, false, out, in, N, dY.data(), out, X.data(), in, 1.f, dW.data(), in};
            break;
        }
        const double err = check(g, seed++);
        if (!(err <= kTolerance)) {
          std::fflush(stdout);
          std::fprintf(stderr,
                       "sgemm_%s: WRONG RESULT: %s %s %s (M %d N %d K %d): worst relative error %.3g > %.0e\n",
                       kLib, m->name, L.name, product_name(p), g.M, g.N, g.K, err, kTolerance);
          return 3;
        }
        Row r{m->name, L.name, p, g.M, g.N, g.K, 2.0 * g.M * double(g.N) * g.K, {}, err};
        r.t = time_gemm(g, min_time, batches);
        std::printf("RESULT\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.6f\t%d\t%d\t%.6e\t%.6e\t%.2f\t%.2f\t%.2f\t%.2e\n", kLib,
                    m->name, L.name, product_name(p), g.M, g.N, g.K, r.flops / 1e9, r.t.reps, batches,
                    r.t.median, r.t.best, r.flops / r.t.median / 1e9, r.flops / r.t.best / 1e9, r.t.cpu_util,
                    err);
        std::fflush(stdout);
        rows.push_back(r);
      }
    }
  }

  // Per model: each product over the model's linears, then all three.
  std::printf("# TOTAL\tlib\tmodel\tproduct\tgflop\tseconds\tgflops\n");
  struct Sum {
    double flops = 0, secs = 0;
  };
  std::map<std::string, Sum> totals;
  for (const Model* m : run) {
    Sum all;
    for (Product p : kProducts) {
      Sum s;
      for (const Row& r : rows)
        if (r.model == m->name && r.product == p) {
          const int n = per_step(*m, r.layer);
          s.flops += n * r.flops, s.secs += n * r.t.median;
        }
      std::printf("TOTAL\t%s\t%s\t%s\t%.6f\t%.6e\t%.2f\n", kLib, m->name, product_name(p), s.flops / 1e9, s.secs,
                  s.flops / s.secs / 1e9);
      totals[std::string(m->name) + "/" + product_name(p)] = s;
      all.flops += s.flops, all.secs += s.secs;
    }
    std::printf("TOTAL\t%s\t%s\tall\t%.6f\t%.6e\t%.2f\n", kLib, m->name, all.flops / 1e9, all.secs,
                all.flops / all.secs / 1e9);
    totals[std::string(m->name) + "/all"] = all;
  }

  // The human table.
  std::printf("\nsgemm_%s, %d threads, GFLOP/s of the median batch (best in parentheses)\n", kLib, threads);
  std::printf("%-11s %-8s %-7s %6s %6s %6s %16s %5s %9s\n", "model", "layer", "product", "M", "N", "K",
              "GFLOP/s", "cpu", "rel.err");
  for (const Row& r : rows)
    std::printf("%-11s %-8s %-7s %6d %6d %6d %7.1f (%6.1f) %5.2f %9.1e\n", r.model.c_str(), r.layer.c_str(),
                product_name(r.product), r.M, r.N, r.K, r.flops / r.t.median / 1e9, r.flops / r.t.best / 1e9,
                r.t.cpu_util, r.err);
  std::printf("\n%-11s %-8s %9s %9s %9s %9s\n", "model", "", "forward", "dX", "dW", "all");
  for (const Model* m : run) {
    std::printf("%-11s %-8s", m->name, "total");
    for (const char* p : {"forward", "dX", "dW", "all"}) {
      const Sum& s = totals[std::string(m->name) + "/" + p];
      std::printf(" %9.1f", s.flops / s.secs / 1e9);
    }
    std::printf("\n");
  }
  return 0;
}
