// OpenBLAS's kernels chosen for the CPU (kernels/cpu/blas_core.h): the table
// from features to cores, the sgemm check, and the trainer's start-up line in
// the three cases (chosen and checked, asked for by the user, taken back).
#include <catch2/catch.hpp>

#include "tests/build_paths.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "e2e_util.h"
#include "kernels/cpu/blas_core.h"

using namespace trainer;
namespace fs = std::filesystem;

namespace {

cpu::CpuFeatures features(bool avx, bool avx2_fma, bool avx512, bool amd) {
  cpu::CpuFeatures f;
  f.avx = avx;
  f.avx2 = f.fma = avx2_fma;
  f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = avx512;
  f.amd = amd;
  return f;
}

// The start-up's BLAS line of a 1-step run on byte tokens, with `env` set
// (and nothing this process inherited from its own choice).
std::string blas_line(const fs::path& dir, const std::string& env) {
  const std::string tokens = e2e::write_byte_tokens(dir).string();
  std::string out;
  const int rc = e2e::run("env -u OPENBLAS_CORETYPE -u TRAINER_BLAS_CORE_SET -u TRAINER_BLAS_CORE_PICKED "
                          "-u TRAINER_BLAS_CORE_REJECTED " + env + " " + TRAINER_BIN + " --config " + TRAINER_SOURCE_DIR +
                              "/configs/tiny.yaml --set train.steps=1 --set train.eval_interval=0" +
                              " --set checkpoint.interval=0 --set run.dir=" + (dir / "run").string() +
                              " --set data.train=[" + tokens + "] --set data.valid=[" + tokens + "]",
                          &out);
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  fs::remove_all(dir / "run");
  const auto at = out.find("\nBLAS: ");
  REQUIRE(at != std::string::npos);
  const std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  std::printf("[blas core] %s -> %s\n", env.empty() ? "(default)" : env.c_str(), line.c_str());
  return line;
}

}  // namespace

TEST_CASE("blas core: the best core the CPU's features allow, never a step down", "[blas]") {
  const auto skx = features(true, true, true, false), hsw = features(true, true, false, false),
             zen = features(true, true, false, true), snb = features(true, false, false, false),
             sse = features(false, false, false, false);
  CHECK(cpu::best_blas_core(skx) == "SkylakeX");
  CHECK(cpu::best_blas_core(features(true, true, true, true)) == "SkylakeX");  // Zen 4
  CHECK(cpu::best_blas_core(hsw) == "Haswell");
  CHECK(cpu::best_blas_core(zen) == "Zen");
  CHECK(cpu::best_blas_core(snb) == "Sandybridge");
  CHECK(cpu::best_blas_core(sse).empty());
  // A masked model on AVX-512 (what OpenBLAS 0.3.21 does) and AVX2 machines.
  CHECK(cpu::better_blas_core(skx, "Prescott") == "SkylakeX");
  CHECK(cpu::better_blas_core(skx, "Haswell") == "SkylakeX");
  CHECK(cpu::better_blas_core(hsw, "Nehalem") == "Haswell");
  CHECK(cpu::better_blas_core(zen, "Prescott") == "Zen");
  // Already as good, better, or unknown to the table: left alone.
  CHECK(cpu::better_blas_core(skx, "SkylakeX").empty());
  CHECK(cpu::better_blas_core(skx, "cooperlake").empty());
  CHECK(cpu::better_blas_core(skx, "SapphireRapids").empty());
  CHECK(cpu::better_blas_core(hsw, "Zen").empty());
  CHECK(cpu::better_blas_core(hsw, "SkylakeX").empty());
  CHECK(cpu::better_blas_core(skx, "FutureLake").empty());
  CHECK(cpu::better_blas_core(sse, "Prescott").empty());
  CHECK(cpu::blas_core_level("Prescott") == 0);
  CHECK(cpu::blas_core_level("FutureLake") == -1);
}

TEST_CASE("blas core: the choice from features, OpenBLAS's pick and the user's setting", "[blas]") {
  const auto skx = features(true, true, true, false), hsw = features(true, true, false, false);
  CHECK(cpu::core_to_request(skx, "Prescott", "") == "SkylakeX");
  CHECK(cpu::core_to_request(hsw, "Prescott", "") == "Haswell");
  CHECK(cpu::core_to_request(skx, "SkylakeX", "").empty());
  // The user's setting wins, whatever it is: a worse core, an unknown name.
  CHECK(cpu::core_to_request(skx, "Prescott", "Prescott").empty());
  CHECK(cpu::core_to_request(skx, "Prescott", "Haswell").empty());
  CHECK(cpu::core_to_request(skx, "Prescott", "NoSuchCore").empty());
  // The verdict after the restart: the asked core must run and pass the check.
  CHECK(cpu::core_check_verdict("SkylakeX", "SkylakeX", 2e-7).empty());
  CHECK(cpu::core_check_verdict("SkylakeX", "skylakex", 9e-5).empty());
  CHECK(cpu::core_check_verdict("SkylakeX", "Prescott", -1) == "SkylakeX was asked for but OpenBLAS runs Prescott");
  CHECK(cpu::core_check_verdict("SkylakeX", "SkylakeX", 0.03) ==
        "SkylakeX failed the sgemm check (largest relative error 0.03, limit 0.0001)");
  CHECK_FALSE(cpu::core_check_verdict("SkylakeX", "SkylakeX", NAN).empty());
}

TEST_CASE("blas core: the sgemm check catches a kernel that computes wrongly", "[blas]") {
  const double good = cpu::sgemm_check_error(), wrong = cpu::sgemm_check_error(cpu::wrong_sgemm_standin);
  std::printf("[blas core] sgemm check: OpenBLAS %.3g, the stand-in that drops one term %.3g (limit 1e-4)\n", good,
              wrong);
  CHECK(good < 1e-5);
  CHECK(wrong > 1e-3);
  CHECK_FALSE(cpu::core_check_verdict(cpu::blas_core_name(), cpu::blas_core_name(), wrong).empty());
}

TEST_CASE("blas core: the kernels this process runs pass the sgemm check", "[blas]") {
  const double err = cpu::sgemm_check_error();
  std::printf("[blas core] %s: sgemm against the double loop, largest relative error %.3g (limit 1e-4)\n",
              cpu::blas_core_name().c_str(), err);
  CHECK(err < 1e-5);
}

TEST_CASE("blas core: the start-up line says which core runs and why", "[blas][binary]") {
  const fs::path dir = fs::temp_directory_path() / ("trainer_blas_core_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Left to the trainer: a core at least as good as the CPU allows, or
  // OpenBLAS's own with the reason.
  const std::string line = blas_line(dir, "");
  const cpu::CpuFeatures cpu = cpu::cpu_features();
  const std::string best = cpu::best_blas_core(cpu);
  const std::string runs = line.substr(std::string("BLAS: core ").size(), line.find(',') - 11);
  INFO(line << " (best for this CPU: " << best << ")");
  if (line.find("chosen for this CPU") != std::string::npos) {
    CHECK(runs == best);
    CHECK_THAT(line, Catch::Contains("sgemm checked") && Catch::Contains("keeps OpenBLAS's choice"));
  } else {
    CHECK_THAT(line, Catch::Contains("OpenBLAS's choice"));
    CHECK(cpu::better_blas_core(cpu, runs).empty());
  }
  // trainer devices says the same for a CPU run here (scripts read it).
  std::string devices;
  // (Its exit status is about the CUDA module, which is not this test's.)
  e2e::run("env -u OPENBLAS_CORETYPE -u TRAINER_BLAS_CORE_SET -u TRAINER_BLAS_CORE_PICKED "
           "-u TRAINER_BLAS_CORE_REJECTED " + std::string(TRAINER_BIN) + " devices", &devices);
  CHECK_THAT(devices, Catch::Contains("\ncpu BLAS: OpenBLAS ") && Catch::Contains(line.substr(6) + "\n"));
  // The user's choice is kept and named.
  CHECK(blas_line(dir, "OPENBLAS_CORETYPE=Prescott") == "BLAS: core Prescott, OPENBLAS_CORETYPE=Prescott");
  // A core whose sgemm computes wrongly (the stand-in, on the core set as
  // the trainer sets it) is taken back: the run goes on with OpenBLAS's own
  // choice and says why.
  const std::string wrong = blas_line(
      dir, "OPENBLAS_CORETYPE=Prescott TRAINER_BLAS_CORE_SET=Prescott TRAINER_BLAS_CORE_PICKED=Prescott "
           "TRAINER_TEST_BLAS_CHECK=wrong");
  CHECK_THAT(wrong, Catch::Contains("OpenBLAS's choice") &&
                        Catch::Contains("Prescott failed the sgemm check (largest relative error") &&
                        Catch::Contains("OPENBLAS_CORETYPE=NAME forces a core"));
  // A core OpenBLAS does not run as asked is taken back, saying so.
  const std::string back = blas_line(dir, "OPENBLAS_CORETYPE=NoSuchCore TRAINER_BLAS_CORE_SET=NoSuchCore");
  CHECK_THAT(back, Catch::Contains("OpenBLAS's choice") &&
                       Catch::Contains("NoSuchCore was asked for but OpenBLAS runs") &&
                       Catch::Contains("OPENBLAS_CORETYPE=NAME forces a core"));
  fs::remove_all(dir);
}
