// Which OpenBLAS kernels ("core") the process runs, and choosing better ones
// when OpenBLAS did not recognise the CPU. OpenBLAS's DYNAMIC_ARCH build picks
// its core from the CPU model; a cloud VM that masks the model ("Intel(R)
// Xeon(R) Processor") gets its 2004-era Prescott kernels, three times slower
// on an AVX-512 CPU. The library reads OPENBLAS_CORETYPE when it loads, so the
// choice is made before the process re-executes itself (app/main.cpp) and
// checked against a plain sgemm after.
#pragma once

#include <string>

namespace trainer::cpu {

// What the CPU can run, from cpuid (and the OS's saving of AVX state).
struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool amd = false;
  std::string model;  // the brand string, as /proc/cpuinfo's "model name"
};
CpuFeatures cpu_features();

// A core's vector level: 3 AVX-512, 2 AVX2+FMA, 1 AVX, 0 SSE only, -1 a name
// this table does not know (never replaced: it may be newer than the table).
int blas_core_level(const std::string& core);
// The best core the features allow (SkylakeX, Haswell or Zen, Sandybridge),
// "" when nothing above SSE is there.
std::string best_blas_core(const CpuFeatures& cpu);
// The core to ask for instead of `picked`, "" to keep it.
std::string better_blas_core(const CpuFeatures& cpu, const std::string& picked);

// The whole choice, as a pure function: the core to ask for given what the
// CPU can run, what OpenBLAS picked and the user's OPENBLAS_CORETYPE ("" when
// unset; any setting wins: nothing is asked for), "" to keep OpenBLAS's pick.
std::string core_to_request(const CpuFeatures& cpu, const std::string& picked, const std::string& user_setting);
// The verdict on a requested core: "" when OpenBLAS runs `asked` and its
// sgemm check's error is within the limit, else why it must be taken back.
std::string core_check_verdict(const std::string& asked, const std::string& runs, double check_error);

// OpenBLAS's own name for the core it runs.
std::string blas_core_name();

// Before the re-execution: when OPENBLAS_CORETYPE is unset and OpenBLAS
// picked less than the CPU can run, sets it (and TRAINER_BLAS_CORE_PICKED to
// what OpenBLAS had picked) and returns true: the caller must re-execute.
bool choose_blas_core();
// After it: when the core is one choose_blas_core set, multiplies a few
// matrices with it against a plain double-precision loop. On a mismatch it
// puts OpenBLAS's own choice back (TRAINER_BLAS_CORE_REJECTED says why) and
// returns true: the caller must re-execute again.
bool reject_unverified_blas_core();

// A column-major sgemm with the Fortran BLAS's signature.
using SgemmFn = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                         const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                         const float* beta, float* c, const int* ldc);
// The largest relative error of `sgemm` (null: OpenBLAS's) against the
// reference over the shapes and transpositions the trainer's linears use.
double sgemm_check_error(SgemmFn sgemm = nullptr);
// A stand-in that computes wrongly, as a broken kernel would: OpenBLAS's
// sgemm with the last term of every dot product dropped. The test hook
// TRAINER_TEST_BLAS_CHECK=wrong makes the start-up check use it, so the
// fallback can be seen end to end.
void wrong_sgemm_standin(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                         const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                         const float* beta, float* c, const int* ldc);

// For the start-up line: "core SkylakeX (...why, and how to choose another)".
std::string blas_core_summary();

}  // namespace trainer::cpu
