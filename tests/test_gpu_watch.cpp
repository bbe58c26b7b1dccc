// Why a rank is slow (issue 45 item 4): NVML read through a stand-in
// library that scripts a device (tests/nvml_standin.cpp): the reader's
// values as scripted, the throttle reasons by name, and through the real
// binary on dp2 a rank whose GPU throttles and then reports uncorrected ECC
// errors: the straggler alert names the cause, the ECC errors are reported
// at once, ranks.jsonl and TensorBoard get the samples; a CPU run says in
// one line that it reads nothing.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "e2e_util.h"
#include "observe/gpu_report.h"
#include "runtime/nvml.h"
#include "tests/build_paths.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Device 1 healthy for 2 samples, then hot and slow; from sample 8 also 2 uncorrected ECC errors.
const char* const kScript =
    "# device from sm max temp power limit reasons ecc mem_mib\n"
    "1 2 1210 1980 91 690 700 0x40 0 2048\n"
    "1 8 1210 1980 92 695 700 0x40 2 2048\n";

}  // namespace

TEST_CASE("gpu report: throttle reasons by name, a throttled GPU, the cause in words", "[nvml]") {
  CHECK(throttle_names(0x40 | 0x4) == "thermal slowdown (hardware), power cap (software)");
  CHECK(throttle_names(0x1 | 0x2 | 0x100).empty());  // idle, application clocks, display: no fault
  GpuHealth g;
  g.read = true;
  g.sm_mhz = 1980;
  g.sm_max_mhz = 1980;
  CHECK(!gpu_throttled(g));
  g.sm_mhz = 1700;  // below 90% of the maximum with no reason given
  CHECK(gpu_throttled(g));
  g.sm_mhz = 1210;
  g.throttle = 0x40;
  g.temperature_c = 91;
  g.power_w = 690;
  g.power_limit_w = 700;
  CHECK(gpu_cause(g) == "SM clock 1.21 of 1.98 GHz, thermal slowdown (hardware), 91 C, 690 of 700 W");
  CHECK(gpu_json(g).find("\"throttle_reasons\": \"0x40\"") != std::string::npos);
}

TEST_CASE("nvml reader: the stand-in's scripted device, sample by sample, and a missing library named", "[nvml]") {
  const fs::path script = fs::temp_directory_path() / ("nvml_script_" + std::to_string(::getpid()));
  std::ofstream(script) << kScript;
  setenv("TRAINER_NVML_LIBRARY", NVML_STANDIN_FILE, 1);
  setenv("TRAINER_NVML_STANDIN_SCRIPT", script.c_str(), 1);
  std::string why;
  {
    auto r = NvmlReader::open(1, &why);
    INFO(why);
    REQUIRE(r);
    const GpuHealth a = r->read(), b = r->read(), c = r->read();
    CHECK(a.read);
    CHECK(a.sm_mhz == 1980);
    CHECK(!gpu_throttled(b));
    CHECK(c.sm_mhz == 1210);
    CHECK(c.throttle == 0x40);
    CHECK(c.temperature_c == 91);
    CHECK(c.power_w == 690);
    CHECK(c.memory_used_gib == 2.0);
    CHECK(gpu_throttled(c));
    CHECK(r->ecc_uncorrected() == 0);
    for (int i = 0; i < 6; ++i) r->read();  // samples 3-8: the ninth sample is the eighth from 0
    CHECK(r->ecc_uncorrected() == 2);
  }
  setenv("TRAINER_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1", 1);
  CHECK(!NvmlReader::open(0, &why));
  CHECK(why.find("/nonexistent/libnvidia-ml.so.1 cannot be loaded") != std::string::npos);
  unsetenv("TRAINER_NVML_LIBRARY");
  unsetenv("TRAINER_NVML_STANDIN_SCRIPT");
  fs::remove(script);
}

TEST_CASE("a throttling, then erroring GPU on rank 1 of dp2: the straggler alert names the cause, ECC at once",
          "[nvml][e2e][serial]") {
  const e2e::Setup s = e2e::make_setup(
      "nvml", "dp2", "{arch: llama, d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, d_ff: 64, max_seq_len: 32}");
  const fs::path script = s.dir / "nvml_script.txt";
  std::ofstream(script) << kScript;
  // Rank 1 also sleeps 40 ms a step (as a throttled GPU would be slow), which makes it the straggler.
  setenv("TRAINER_TEST_HOOKS", "delay=1:40", 1);
  setenv("TRAINER_NVML_LIBRARY", NVML_STANDIN_FILE, 1);
  setenv("TRAINER_NVML_STANDIN_SCRIPT", script.c_str(), 1);
  const std::string dir = (s.dir / "run").string();
  std::string out;
  const int rc = e2e::run_by_hand(s.cfg, 2, dir, &out,
                                  "--set log.interval=2 --set log.straggler_intervals=3 --set "
                                  "log.straggler_threshold=0.5 --set log.tensorboard=true");
  unsetenv("TRAINER_TEST_HOOKS");
  unsetenv("TRAINER_NVML_LIBRARY");
  unsetenv("TRAINER_NVML_STANDIN_SCRIPT");
  INFO(e2e::tail(out));
  REQUIRE(rc == 0);
  const auto at = out.find("straggler: rank 1 (host ");
  REQUIRE(at != std::string::npos);
  const std::string alert = out.substr(at, out.find('\n', at) - at);
  const auto ecc = out.find("nvml: rank 1 on ");
  const std::string ecc_line = ecc == std::string::npos ? "" : out.substr(ecc, out.find('\n', ecc) - ecc);
  std::printf("[nvml] %s\n[nvml] %s\n", alert.c_str(), ecc_line.c_str());
  CHECK(alert.find("its GPU: SM clock 1.21 of 1.98 GHz, thermal slowdown (hardware), 91 C, 690 of 700 W") !=
        std::string::npos);
  CHECK(ecc_line.find("its GPU 1 reports 2 new uncorrected ECC errors after step") != std::string::npos);
  CHECK(out.find("nvml: " + std::string(NVML_STANDIN_FILE) + ", each rank's GPU") != std::string::npos);
  const std::string ranks = read_all(fs::path(dir) / "ranks.jsonl");
  CHECK(ranks.find("\"rank\": 1, ") != std::string::npos);
  CHECK(ranks.find("\"sm_clock_mhz\": 1210, \"sm_clock_max_mhz\": 1980") != std::string::npos);
  CHECK(ranks.find("\"ecc_uncorrected\": 2") != std::string::npos);
  std::string events;
  for (const auto& f : fs::recursive_directory_iterator(fs::path(dir) / "tensorboard"))
    if (f.is_regular_file()) events += read_all(f.path());
  CHECK(events.find("gpu/rank1/sm_clock_mhz") != std::string::npos);
  CHECK(events.find("gpu/rank1/ecc_uncorrected") != std::string::npos);
  // Without the stand-in a CPU run reads nothing and says so once.
  out.clear();
  REQUIRE(e2e::run_by_hand(s.cfg, 1, (s.dir / "cpu").string(), &out, "--set train.steps=2") == 0);
  CHECK(out.find("nvml: not read (a CPU run has no GPU to watch)") != std::string::npos);
  fs::remove_all(s.dir);
}
