// trainer: one binary, configured by one YAML file.
//   trainer --config run.yaml [--set key.path=value ...] [--print-config]
// Exit codes: 0 success, 1 a run-time failure (data, IO, divergence),
// 2 a user mistake in the command line or the configuration.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "trainer/config.h"
#include "trainer/engine.h"

namespace {
// OpenMP threads that spin after a parallel region steal the cores OpenBLAS's
// own threads need for the next GEMM (measured: 1.6x slower steps on 2 cores).
// libgomp reads the policy when it loads, before main, so the process
// re-executes itself once with the variable set; a user's own value wins.
void ensure_passive_omp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: run as we are
}
}  // namespace

int main(int argc, char** argv) {
  ensure_passive_omp_wait(argv);
  CLI::App app{"trainer: train Transformer and MoE language models from one YAML file"};
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  trainer::RunOptions opt;
  app.add_option("-c,--config", config_path, "YAML run configuration");
  app.add_option("--set", overrides, "override one key, e.g. --set optim.lr=1e-3 (repeatable)")
      ->take_all();
  app.add_flag("--print-config", print_config, "print the resolved configuration as YAML and exit");
  app.add_option("--dump-reference", opt.dump_reference_dir,
                 "also write the PyTorch-reference dump (docs/MODEL_MATH.md) into this directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see trainer --help)\n", e.what());
    return 2;
  }

  try {
    if (config_path.empty())
      throw trainer::ConfigError("no configuration given: pass --config FILE (see configs/)");
    trainer::Config cfg = trainer::load_config_file(config_path, overrides);
    if (print_config) {
      std::fputs(trainer::config_to_yaml(cfg).c_str(), stdout);
      return 0;
    }
    std::printf("config: %s\n", cfg.source.c_str());
    trainer::run_training(cfg, opt);
    return 0;
  } catch (const trainer::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
