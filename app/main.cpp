// trainer: one binary, configured by one YAML file.
//   trainer --config run.yaml [--set key.path=value ...] [--print-config]
//   trainer --config run.yaml --smoke-test [--steps N]
//   trainer --config run.yaml --resume CKPT_DIR
//   trainer inspect CKPT_DIR
//   trainer schedule --config run.yaml [--world N]
//   trainer export --checkpoint DIR --out DIR [--dtype bf16|fp32] [--max-shard-size 5GB]
//   trainer plan --config run.yaml [--world N] [--gpus-per-node G] [--gpu NAME] [--search [--top K]]
//   trainer generate --checkpoint DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
//                    [--seed S] [--device cpu|cuda|auto] [--tokenizer PATH] [--compare]
//   trainer devices
// Exit codes: 0 success, 1 a run-time failure (data, IO, divergence),
// 2 a user mistake in the command line or the configuration (a run
// directory another trainer holds included: train/run_lock.h), 3 a distributed
// failure: a collective or the store timed out or a rank went missing
// (runtime/watchdog.h; torchrun's restarts take over).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/config.h"
#include "train/step_policy.h"
#include "train/preemption.h"
#include "app/devices_command.h"
#include "train/engine.h"
#include "interop/hf_export.h"
#include "interop/hf_import.h"
#include "comm/launch.h"
#include "comm/store.h"
#include "comm/store_secret.h"
#include "app/plan_command.h"
#include "app/generate_command.h"
#include "app/schedule_command.h"
#include "verify/smoke.h"
#include "runtime/watchdog.h"

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
  bool smoke = false;
  int64_t smoke_steps = 0;
  std::string resume;
  app.add_flag("--smoke-test", smoke,
               "run a short proof of this configuration (temporary checkpoints) and print a verdict");
  app.add_option("--steps", smoke_steps, "steps of the smoke test (default smoke.steps)");
  app.add_option("--resume", resume, "resume from this checkpoint directory (same as --set checkpoint.resume=PATH)");
  app.add_option("--stop-after", opt.stop_after,
                 "stop after this step; the LR schedule still spans train.steps");
  std::string inspect_dir;
  CLI::App* inspect = app.add_subcommand("inspect", "print what a checkpoint directory holds");
  inspect->add_option("dir", inspect_dir, "checkpoint directory (step_XXXXXXXX)")->required();
  trainer::ExportOptions export_opt;
  std::string export_dtype = "fp32", export_shard = "5GB";
  CLI::App* exporter = app.add_subcommand("export", "write a checkpoint as a Hugging Face model directory");
  exporter->add_option("--checkpoint", export_opt.checkpoint, "checkpoint step directory (or a root with `latest`)")
      ->required();
  exporter->add_option("--out", export_opt.out, "new directory to write (config.json, model.safetensors)")->required();
  exporter->add_option("--dtype", export_dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  exporter->add_option("--max-shard-size", export_shard, "largest safetensors file before sharding (e.g. 5GB, 200MB)");
  int schedule_world = 0;
  CLI::App* schedule = app.add_subcommand(
      "schedule", "print the pipeline schedule of --config: per-rank timeline, bubble, activation memory");
  schedule->add_option("--world", schedule_world,
                       "processes of the run (default tp x pp x cp x max(dp, 1) of the configuration)");
  schedule->fallthrough();  // --config and --set belong to the main command
  trainer::PlanOptions plan_opt;
  CLI::App* plan = app.add_subcommand(
      "plan", "print the memory, communication, bubble and estimated step time of --config on a GPU, launching "
              "nothing; --search ranks every layout of the world size");
  plan->add_option("--world", plan_opt.world, "GPUs of the run (default tp x pp x cp x max(dp, 1) of the configuration)");
  plan->add_option("--gpus-per-node", plan_opt.gpus_per_node, "GPUs per node (default hardware.gpus_per_node, else 8)");
  plan->add_option("--gpu", plan_opt.gpu, "GPU of the hardware table (default hardware.gpu): " + trainer::known_gpu_names());
  plan->add_flag("--search", plan_opt.search, "rank every layout of the world size that keeps the global batch");
  plan->add_option("--top", plan_opt.top, "layouts the search prints (default 10)");
  plan->fallthrough();
  trainer::GenerateOptions gen;
  CLI::App* generate = app.add_subcommand("generate", "continue a prompt with the model of a checkpoint (key/value cache)");
  generate->add_option("--checkpoint", gen.checkpoint, "checkpoint step directory (or a root with `latest`)")->required();
  generate->add_option("--prompt", gen.prompt, "text to continue, encoded with the data's tokenizer")->required();
  generate->add_option("--tokens", gen.tokens, "tokens to generate (default 200)");
  generate->add_option("--temperature", gen.temperature, "sampling temperature; 0: greedy (default 0.8)");
  generate->add_option("--top-k", gen.top_k, "sample among the k most likely tokens (default 0: all)");
  generate->add_option("--seed", gen.seed, "seed of the sampling (default 1234)");
  generate->add_option("--device", gen.device, "cpu, cuda or auto (default auto)");
  generate->add_option("--tokenizer", gen.tokenizer,
                       "tokenizer file or directory (default: the run's, see README \"Generating text\")");
  generate->add_flag("--compare", gen.compare, "also run the no-cache reference and say whether the tokens agree");
  CLI::App* devices = app.add_subcommand(
      "devices", "say what CUDA this machine and build offer (driver, CUDA module, devices) and what device: auto picks");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see trainer --help)\n", e.what());
    return 2;
  }

  try {
    if (*devices) {
      bool ok = true;
      std::fputs(trainer::describe_devices(&ok).c_str(), stdout);
      return ok ? 0 : 1;
    }
    if (*inspect) {
      const std::string report = trainer::describe_checkpoint(inspect_dir);
      std::fputs(report.c_str(), stdout);
      // Scripts check the exit code before they trust a checkpoint.
      return report.find("status: CORRUPT") == std::string::npos ? 0 : 1;
    }
    if (*exporter) {
      export_opt.dtype = export_dtype == "bf16" ? trainer::DType::BF16 : trainer::DType::F32;
      export_opt.max_shard_bytes = trainer::parse_size(export_shard, "--max-shard-size");
      std::fputs(trainer::export_to_hf(export_opt).c_str(), stdout);
      return 0;
    }
    if (*generate) return trainer::run_generate(gen);
    if (!resume.empty()) overrides.push_back("checkpoint.resume=" + resume);
    if (config_path.empty())
      throw trainer::ConfigError("no configuration given: pass --config FILE (see configs/)");
    if (*plan) {
      if (plan_opt.world < 0 || (plan->count("--world") && plan_opt.world == 0))
        throw trainer::ConfigError("--world " + std::to_string(plan_opt.world) + ": the number of GPUs must be >= 1");
      if (plan->count("--gpus-per-node") && plan_opt.gpus_per_node < 1)
        throw trainer::ConfigError("--gpus-per-node " + std::to_string(plan_opt.gpus_per_node) + " must be >= 1");
      const trainer::Config cfg = trainer::load_plan_config(config_path, overrides, plan_opt);
      std::fputs(trainer::describe_plan(cfg, plan_opt).c_str(), stdout);
      return 0;
    }
    if (*schedule) {
      if (config_path.empty()) throw trainer::ConfigError("trainer schedule needs --config FILE");
      const trainer::Config cfg = trainer::load_config_file(config_path, overrides, std::max(schedule_world, 0));
      if (schedule_world <= 0) {
        const auto& p = cfg.parallel;
        schedule_world = p.tp * p.pp * p.cp * (p.dp > 0 ? p.dp : 1);
      }
      std::fputs(trainer::describe_schedule(cfg, schedule_world).c_str(), stdout);
      return 0;
    }
    const trainer::LaunchInfo launch = trainer::detect_launch();
    trainer::Config cfg = trainer::load_config_file(config_path, overrides, launch.world_size);
    // Before --print-config, so that it shows what the run would use.
    const std::vector<std::string> adopted = trainer::adopt_init_from_settings(cfg);
    // Once per job, on stderr so that --print-config's YAML stays clean.
    if (launch.rank == 0)
      for (const std::string& w : trainer::config_warnings(cfg)) std::fprintf(stderr, "warning: %s\n", w.c_str());
    if (print_config) {
      std::fputs(trainer::config_to_yaml(cfg).c_str(), stdout);
      return 0;
    }
    if (launch.rank == 0) std::printf("config: %s\n%s\n", cfg.source.c_str(), launch.describe().c_str());
    if (launch.rank == 0)
      for (const std::string& line : adopted) std::printf("%s\n", line.c_str());
    if (launch.rank == 0 && launch.launched())
      std::printf("%s\n", trainer::store_secret_from_env().empty()
                               ? "store: no TRAINER_STORE_SECRET: the job token turns away other jobs, not other users "
                                 "who can reach the port (README, Distributed runs)"
                               : "store: every rank must prove it holds TRAINER_STORE_SECRET");
    opt.launch = launch;
    if (smoke) return trainer::run_smoke_test(cfg, smoke_steps > 0 ? smoke_steps : cfg.smoke.steps, launch);
    if (smoke_steps > 0) throw trainer::ConfigError("--steps applies to --smoke-test only");
    const trainer::TrainSummary summary = trainer::run_training(cfg, opt);
    return summary.preempted ? trainer::kPreemptedExitCode : 0;
  } catch (const trainer::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const trainer::StepPolicyStop& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return trainer::kStoppedByPolicyExitCode;
  } catch (const trainer::DistributedFailure& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return trainer::kDistributedFailureExitCode;
  } catch (const trainer::StoreAuthError& e) {
    // TRAINER_STORE_SECRET missing or different on some rank: a setup
    // mistake, like a bad config (exit 2), not a failure of the run.
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
