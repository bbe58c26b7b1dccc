// The CUDA backend as a module (core/cuda_module.h): a CPU run, of the real
// binary or in process, maps none of the CUDA libraries; no executable needs
// them; and, in a CUDA build, the module loads without a driver, says what it
// is, and train.device=cuda fails clearly when no device can be used.
// Tests tagged [cuda_module] need libtrainer_cuda.so: a CPU-only build
// leaves them out and ctest reports cuda_module_tests as skipped.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "tests/build_paths.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/nccl_table.h"
#include "config/config.h"
#include "core/cuda_backend.h"
#include "core/cuda_module.h"
#include "kernels/cuda_ops_table.h"
#include "runtime/cuda_driver.h"
#include "runtime/device_select.h"
#include "tests/e2e_util.h"
#include "tests/temp_dir.h"
#include "train/engine.h"

namespace fs = std::filesystem;
using namespace trainer;

namespace {

// What a CPU run must not have mapped. libcuda.so.1 (the driver) is allowed
// under train.device=auto, which asks it whether there is a GPU.
const std::vector<std::string> kCudaLibraries = {"libcudart", "libcublas", "libnccl", "libtrainer_cuda"};

std::set<std::string> mapped_files(const std::string& maps_path) {
  std::set<std::string> files;
  std::ifstream in(maps_path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos) files.insert(line.substr(slash));
  }
  return files;
}

// The first mapped file whose name holds one of `names`, or "".
std::string first_mapped(const std::set<std::string>& files, const std::vector<std::string>& names) {
  for (const std::string& f : files)
    for (const std::string& n : names)
      if (fs::path(f).filename().string().find(n) != std::string::npos) return f;
  return "";
}

std::string tiny_config(const test::TempDir& dir, const std::string& device, int64_t steps) {
  const fs::path tokens = e2e::write_byte_tokens(dir.path);
  const std::string cfg = dir / ("cfg_" + device + ".yaml");
  std::ofstream(cfg) << "run: {name: cuda_module}\n"
                     << "model: {arch: llama, d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 32}\n"
                     << "train: {device: " << device << ", steps: " << steps
                     << ", seq_len: 32, micro_batch_size: 2, global_batch_size: 2, threads: 1, eval_interval: 0}\n"
                     << "data: {train: [" << tokens.string() << "]}\n"
                     << "checkpoint: {interval: 0}\n"
                     << "log: {interval: 1, progress: lines}\n";
  return cfg;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A trainer process that is SIGKILLed when the test leaves its scope.
struct RunningTrainer {
  pid_t pid = -1;
  std::string log;
  ~RunningTrainer() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

// The files mapped by `trainer` (with `env_prefix` before it) once its first
// step has been logged: device choice, model, optimizer and a step all done.
std::set<std::string> maps_after_first_step(const std::string& env_prefix, const std::string& cfg,
                                            const std::string& run_dir, std::string* log_text) {
  RunningTrainer t;
  t.log = run_dir + ".log";
  const std::string cmd = "exec env " + env_prefix + " " + TRAINER_BIN + " --config " + cfg + " --set run.dir=" + run_dir +
                          " > " + t.log + " 2>&1";
  t.pid = ::fork();
  REQUIRE(t.pid >= 0);
  if (t.pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (true) {
    if (fs::exists(metrics) && fs::file_size(metrics) > 0) break;
    int status = 0;
    if (::waitpid(t.pid, &status, WNOHANG) == t.pid) {
      t.pid = -1;
      FAIL("the trainer ended before its first step was logged: " << read_file(t.log));
    }
    if (std::chrono::steady_clock::now() > deadline) FAIL("no step logged within 120 s: " << read_file(t.log));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The same pid: the shell exec'ed the trainer, which re-execs itself in place.
  std::set<std::string> files = mapped_files("/proc/" + std::to_string(t.pid) + "/maps");
  *log_text = read_file(t.log);
  return files;
}

std::string device_line(const std::string& log) {
  const size_t k = log.find("device: ");
  return k == std::string::npos ? "(no device line)" : log.substr(k, log.find('\n', k) - k);
}

// The dynamic section's NEEDED entries of an ELF file, by readelf.
std::vector<std::string> needed_libraries(const std::string& elf) {
  std::string out;
  const int rc = e2e::run("readelf -d '" + elf + "'", &out);
  REQUIRE(rc == 0);
  std::vector<std::string> libs;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("(NEEDED)") == std::string::npos) continue;
    const size_t a = line.find('['), b = line.find(']');
    if (a != std::string::npos && b != std::string::npos) libs.push_back(line.substr(a + 1, b - a - 1));
  }
  return libs;
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

// A CUDA runtime or driver would answer on this machine: the checks that
// expect "no device" do not apply.
bool machine_has_gpu() { return cuda_module_built() && probe_cuda_driver().devices > 0; }

}  // namespace

TEST_CASE("no executable needs a CUDA library", "[cuda_free]") {
  for (const std::string& exe : {std::string(TRAINER_BIN), self_exe()}) {
    const std::vector<std::string> libs = needed_libraries(exe);
    INFO(exe << " needs " << libs.size() << " libraries");
    REQUIRE(!libs.empty());  // readelf answered for a dynamic executable
    for (const std::string& lib : libs) {
      INFO(exe << " needs " << lib);
      CHECK(lib.rfind("libcu", 0) == std::string::npos);
      CHECK(lib.find("nccl") == std::string::npos);
      CHECK(lib.find("trainer_cuda") == std::string::npos);
    }
  }
}

TEST_CASE("a CPU run of the trainer binary maps no CUDA library", "[cuda_free]") {
  test::TempDir dir("cuda_module", "cpu_run");
  for (const std::string device : {"cpu", "auto"}) {
    std::string log;
    const std::set<std::string> files =
        maps_after_first_step("", tiny_config(dir, device, 100000), dir / ("run_" + device), &log);
    INFO("train.device=" << device << ": " << device_line(log));
    if (device == "auto" && log.find("device: cuda") != std::string::npos) {
      WARN("train.device=auto chose a GPU here: only the train.device=cpu run is checked");
      continue;
    }
    REQUIRE(log.find("device: cpu") != std::string::npos);
    REQUIRE(files.size() > 3);  // the maps were read
    std::vector<std::string> forbidden = kCudaLibraries;
    if (device == "cpu") forbidden.push_back("libcuda.so");  // not even the driver
    const std::string found = first_mapped(files, forbidden);
    INFO("mapped: " << found);
    CHECK(found.empty());
  }
}

TEST_CASE("an in-process CPU run with train.device auto maps no CUDA library", "[cuda_free]") {
  if (cuda_backend_loaded()) {
    WARN("an earlier test of this process loaded the CUDA module: run this test alone (ctest does)");
    return;
  }
  test::TempDir dir("cuda_module", "in_process");
  const std::string yaml = read_file(tiny_config(dir, "auto", 3));
  RunOptions opt;
  opt.quiet = true;
  Config cfg = load_config_text(yaml, "<cuda module test>", {"run.dir=" + (dir / "run")});
  if (machine_has_gpu()) {
    WARN("this machine has a CUDA device: train.device=auto would use it");
    return;
  }
  const TrainSummary s = run_training(cfg, opt);
  CHECK(s.losses.size() == 3);
  CHECK_FALSE(cuda_backend_loaded());
  const std::string found = first_mapped(mapped_files("/proc/self/maps"), kCudaLibraries);
  INFO("mapped: " << found);
  CHECK(found.empty());
}

TEST_CASE("train.device cuda without a usable device is a configuration error naming the reason", "[cuda_free]") {
  if (machine_has_gpu()) {
    WARN("this machine has a CUDA device: nothing to refuse");
    return;
  }
  test::TempDir dir("cuda_module", "cuda_refused");
  std::string out;
  const int rc = e2e::run(std::string(TRAINER_BIN) + " --config " + tiny_config(dir, "cuda", 2) +
                              " --set run.dir=" + (dir / "run"),
                          &out);
  INFO(out);
  CHECK(rc == 2);
  CHECK_THAT(out, Catch::Contains("error: train.device: 'cuda' requested but no CUDA device can be used ("));
  CHECK_THAT(out, Catch::Contains("); use train.device=cpu or auto"));
  if (!cuda_module_built()) CHECK_THAT(out, Catch::Contains("(this build has no CUDA backend)"));
  else
    CHECK_THAT(out, Catch::Contains(probe_cuda_driver().why));  // the driver's answer, e.g. "no CUDA driver: ..."
}

#ifdef TRAINER_HAVE_CUDA
TEST_CASE("the CUDA module loads without a driver and reports its ABI", "[cuda_module]") {
  std::string why;
  const CudaBackend* cuda = cuda_backend(&why);
  INFO("module " << cuda_module_path() << ": " << why);
  REQUIRE(cuda != nullptr);
  CHECK(cuda_backend_loaded());
  CHECK(cuda->abi_version == kCudaBackendAbi);
  CHECK(cuda->signature == kCudaBackendSignature);
  CHECK(cuda->table_bytes == sizeof(CudaBackend));
  // The ops and NCCL tables, each fetched by its own layer.
  const CudaOpsTable* ops = cuda_ops_table(&why);
  INFO("ops table: " << why);
  REQUIRE(ops != nullptr);
  CHECK(ops->abi_version == kCudaOpsAbi);
  CHECK(ops->signature == kCudaOpsSignature);
  CHECK(ops->table_bytes == sizeof(CudaOpsTable));
  CHECK(ops->linear_forward != nullptr);
  CHECK(ops->adamw_update_master_multi != nullptr);
  const NcclTable* nccl = nccl_table(&why);
  INFO("NCCL table: " << why);
  REQUIRE(nccl != nullptr);
  CHECK(nccl->abi_version == kNcclTableAbi);
  CHECK(nccl->signature == kNcclTableSignature);
  CHECK(nccl->table_bytes == sizeof(NcclTable));
  const std::string nccl_about = nccl->version();
  // "NCCL 2.x.y" with the communicators, "no NCCL" without them.
  CHECK((nccl_about.rfind("NCCL ", 0) == 0 || nccl_about == "no NCCL"));
  CHECK((nccl->nccl_world != nullptr) == (nccl_about != "no NCCL"));
  CHECK((nccl->nccl_split != nullptr) == (nccl->nccl_world != nullptr));
  const std::string about = cuda->describe();
  std::printf("[cuda_module] %s: %s, %s\n", cuda_module_path().c_str(), about.c_str(), nccl_about.c_str());
  CHECK_THAT(about, Catch::Contains("CUDA runtime ") && Catch::Contains("cuBLASLt"));
  // The module is the only thing that brought the CUDA runtime in.
  const std::set<std::string> files = mapped_files("/proc/self/maps");
  CHECK_FALSE(first_mapped(files, {"libtrainer_cuda"}).empty());
  CHECK_FALSE(first_mapped(files, {"libcudart"}).empty());
  if (machine_has_gpu()) {
    WARN("this machine has a CUDA device: the no-driver answer is not checked");
    return;
  }
  std::string reason;
  CHECK(cuda->device_count(&reason) == -1);
  INFO("device_count: " << reason);
  CHECK_THAT(reason, Catch::Contains("driver", Catch::CaseSensitive::No));
  // And the trainer's count stops at the driver probe, with its reason.
  std::string probe_reason;
  CHECK(cuda_device_count(&probe_reason) == -1);
  CHECK(probe_reason == probe_cuda_driver().why);
}

TEST_CASE("trainer devices finds the module next to the binary and loads it", "[cuda_module]") {
  std::string out;
  // Without the variable catch_main.cpp sets: the lookup next to the executable.
  const int rc = e2e::run("env -u TRAINER_CUDA_MODULE " + std::string(TRAINER_BIN) + " devices", &out);
  INFO(out);
  CHECK(rc == 0);
  const std::string module = (fs::path(TRAINER_BIN).parent_path() / kCudaModuleFile).string();
  // RTLD_NOW in the trainer binary: every symbol the module takes from it resolved.
  CHECK_THAT(out, Catch::Contains("cuda module: " + module + " (ABI " + std::to_string(kCudaBackendAbi)));
  CHECK_THAT(out, Catch::Contains("cuBLASLt"));
  CHECK_THAT(out, Catch::Contains("train.device=auto: device: "));
  if (!machine_has_gpu()) {
    CHECK_THAT(out, Catch::Contains("cuda driver: none (" + probe_cuda_driver().why + ")"));
    CHECK_THAT(out, Catch::Contains("cuda devices: none ("));
    CHECK_THAT(out, Catch::Contains("train.device=auto: device: cpu (no CUDA device: "));
  }
}

TEST_CASE("a module that cannot be loaded is named with the loader's reason", "[cuda_module]") {
  std::string out;
  int rc = e2e::run("TRAINER_CUDA_MODULE=/nonexistent/libtrainer_cuda.so " + std::string(TRAINER_BIN) + " devices", &out);
  INFO(out);
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("cuda module: not loaded: the CUDA module /nonexistent/libtrainer_cuda.so "
                                  "(from TRAINER_CUDA_MODULE) cannot be loaded (") &&
                      Catch::Contains("No such file or directory"));
  // A shared library that is not a trainer module.
  std::string other;
  for (const std::string& f : mapped_files("/proc/self/maps"))
    if (fs::path(f).filename().string().rfind("libstdc++.so", 0) == 0) other = f;
  REQUIRE(!other.empty());
  out.clear();
  rc = e2e::run("TRAINER_CUDA_MODULE=" + other + " " + std::string(TRAINER_BIN) + " devices", &out);
  INFO(out);
  CHECK(rc == 1);
  CHECK_THAT(out, Catch::Contains("has no trainer_cuda_backend(): it is not a trainer CUDA module"));
}

TEST_CASE("every table of the loaded module is checked against what its layer expects", "[cuda_module]") {
  // The real module's tables, asked for with one field of the expectation
  // changed: each is refused, the table named, both sides' numbers given.
  for (const CudaTableSpec& real : {kCudaBackendSpec, kCudaOpsSpec, kNcclTableSpec}) {
    std::string why;
    REQUIRE(cuda_module_table(real, &why) != nullptr);
    CudaTableSpec other_abi = real, other_signature = real, other_size = real;
    other_abi.abi_version += 1;
    other_signature.signature ^= 1;
    other_size.table_bytes += sizeof(void*);
    for (const CudaTableSpec& want : {other_abi, other_signature, other_size}) {
      why.clear();
      CHECK(cuda_module_table(want, &why) == nullptr);
      INFO(why);
      CHECK_THAT(why, Catch::Contains("was built from other sources (its " + std::string(real.name) + " table: ABI " +
                                      std::to_string(real.abi_version)));
      CHECK_THAT(why, Catch::Contains("; this trainer needs ABI " + std::to_string(want.abi_version)));
      CHECK_THAT(why, Catch::Contains(std::to_string(want.table_bytes) + "-byte table): rebuild both from one checkout"));
    }
  }
  // One table's entry answering for another: the signatures differ.
  CudaTableSpec swapped = kCudaOpsSpec;
  swapped.entry = kNcclTableEntry;
  std::string why;
  CHECK(cuda_module_table(swapped, &why) == nullptr);
  CHECK_THAT(why, Catch::Contains("its ops table"));
}

TEST_CASE("trainer devices refuses a module with a stale table, naming the table", "[cuda_module]") {
  const std::string devices = "TRAINER_CUDA_MODULE=" + std::string(STAND_IN_CUDA_MODULE_FILE) + " " + TRAINER_BIN + " devices";
  std::string out;
  // Every table matching: the stand-in is described like the real module.
  int rc = e2e::run(devices, &out);
  INFO(out);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("(ABI " + std::to_string(kCudaBackendAbi) + ", signature ") &&
                      Catch::Contains("): stand-in runtime, stand-in NCCL\n"));
  CHECK_THAT(out, Catch::Contains("cuda devices: none (a stand-in module has no devices)"));
  const std::string refused = "cuda module: not loaded: the CUDA module " + std::string(STAND_IN_CUDA_MODULE_FILE) +
                              " (from TRAINER_CUDA_MODULE) was built from other sources (its ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"runtime", "device runtime table: ABI " + std::to_string(kCudaBackendAbi)},
      {"old-runtime", "device runtime table: ABI 1"},
      {"ops", "ops table: ABI " + std::to_string(kCudaOpsAbi)},
      {"no-ops", "ops table: none"},
      {"nccl", "NCCL table: ABI " + std::to_string(kNcclTableAbi)}};
  for (const auto& [table, named] : cases) {
    out.clear();
    rc = e2e::run("STAND_IN_STALE_TABLE=" + table + " " + devices, &out);
    INFO("STAND_IN_STALE_TABLE=" << table << ": " << out);
    CHECK(rc == 1);
    CHECK_THAT(out, Catch::Contains(refused + named) && Catch::Contains("): rebuild both from one checkout\n"));
  }
}

TEST_CASE("train.device auto with a driver that has no device leaves the module unloaded", "[cuda_module]") {
  // The toolkit's stub driver answers cuInit with an error, as a broken or
  // device-less driver would: the probe must stop there.
  const fs::path stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (!fs::exists(stub)) {
    WARN(stub.string() << " is missing: the stub-driver case is not checked");
    return;
  }
  test::TempDir dir("cuda_module", "stub_driver");
  fs::create_directories(dir.path / "driver");
  fs::create_symlink(stub, dir.path / "driver" / "libcuda.so.1");
  std::string log;
  const std::set<std::string> files = maps_after_first_step("LD_LIBRARY_PATH=" + (dir / "driver"),
                                                            tiny_config(dir, "auto", 100000), dir / "run", &log);
  INFO(device_line(log));
  CHECK_THAT(log, Catch::Contains("device: cpu (no CUDA device: the CUDA driver's cuInit failed: "));
  CHECK_FALSE(first_mapped(files, {"libcuda.so"}).empty());  // the stub was asked
  const std::string found = first_mapped(files, kCudaLibraries);
  INFO("mapped: " << found);
  CHECK(found.empty());
}
#endif
