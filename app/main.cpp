// trainer: one binary, configured by one YAML file.
//   trainer --config run.yaml [--set key.path=value ...] [--print-config]
//   trainer --config run.yaml --smoke-test [--steps N]
//   trainer --config run.yaml --resume CKPT_DIR
//   trainer inspect CKPT_DIR
//   trainer schedule --config run.yaml [--world N]
//   trainer export --checkpoint DIR --out DIR [--dtype bf16|fp32] [--max-shard-size 5GB]
//   trainer plan --config run.yaml [--world N] [--gpus-per-node G] [--gpu NAME] [--search [--top K]]
//   trainer calibrate --config run.yaml [--out FILE] [--max-mib N] [--min-kib N] [--quick]   (launched like the run)
//   trainer generate --checkpoint DIR --prompt TEXT [--tokens N] [--temperature T] [--top-k K]
//                    [--seed S] [--device cpu|cuda|auto] [--tokenizer PATH] [--compare]
//   trainer eval --checkpoint DIR --task FILE [--limit N] [--scores FILE]
//   trainer devices
// Exit codes: 0 success, 1 a run-time failure (data, IO, divergence),
// 2 a user mistake in the command line or the configuration (a run
// directory another trainer holds included: train/run_lock.h), 3 a distributed
// failure: a collective or the store timed out or a rank went missing
// (runtime/watchdog.h; torchrun's restarts take over), 4 stopped by the bad-step
// policy (train/step_policy.h), 5 copies that must be identical disagree
// (train/replica_check.h), 75 preempted (train/preemption.h).
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
#include "train/replica_check.h"
#include "train/preemption.h"
#include "app/devices_command.h"
#include "train/engine.h"
#include "interop/hf_export.h"
#include "interop/hf_import.h"
#include "comm/launch.h"
#include "comm/store.h"
#include "comm/store_secret.h"
#include "app/plan_command.h"
#include "app/calibrate_command.h"
#include "app/eval_command.h"
#include "app/generate_command.h"
#include "app/schedule_command.h"
#include "verify/smoke.h"
#include "runtime/watchdog.h"
#include "kernels/cpu/blas_core.h"

namespace {
// Two libraries read their settings when they load, before main, so the
// process re-executes itself once with them set (a user's own values win):
// - OpenMP threads that spin after a parallel region steal the cores
//   OpenBLAS's own threads need for the next GEMM (measured: 1.6x slower
//   steps on 2 cores): OMP_WAIT_POLICY=PASSIVE;
// - OpenBLAS runs 2004-era kernels on a CPU whose model it does not know
//   (kernels/cpu/blas_core.h): OPENBLAS_CORETYPE, checked after the restart,
//   which re-executes once more to take it back if it fails.
void prepare_process(char** argv) {
  bool restart = false;
  if (!std::getenv("OMP_WAIT_POLICY")) {
    ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    restart = true;
  }
  if (trainer::cpu::choose_blas_core()) restart = true;
  if (restart) ::execv("/proc/self/exe", argv);  // returns only on failure: run as we are
  if (trainer::cpu::reject_unverified_blas_core()) ::execv("/proc/self/exe", argv);
}

// Everything the command line sets: the run's options and each subcommand's.
struct CommandLine {
  std::string config_path;
  std::vector<std::string> overrides;
  bool print_config = false;
  trainer::RunOptions opt;
  bool smoke = false;
  int64_t smoke_steps = 0;
  std::string resume;
  std::string inspect_dir;
  trainer::ExportOptions export_opt;
  std::string export_dtype = "fp32", export_shard = "5GB";
  int schedule_world = 0;
  std::string schedule_trace;
  double schedule_forward_ms = 1.0;
  trainer::PlanOptions plan_opt;
  trainer::CalibrateOptions calibrate_opt;
  trainer::GenerateOptions gen;
  trainer::EvalOptions eval;
  CLI::App *inspect = nullptr, *exporter = nullptr, *schedule = nullptr, *plan = nullptr, *generate = nullptr,
           *devices = nullptr, *evaluate = nullptr, *calibrate = nullptr;
};

void add_run_options(CLI::App& app, CommandLine& cl) {
  app.add_option("-c,--config", cl.config_path, "YAML run configuration");
  app.add_option("--set", cl.overrides, "override one key, e.g. --set optim.lr=1e-3 (repeatable)")->take_all();
  app.add_flag("--print-config", cl.print_config, "print the resolved configuration as YAML and exit");
  app.add_option("--dump-reference", cl.opt.dump_reference_dir,
                 "also write the PyTorch-reference dump (docs/MODEL_MATH.md) into this directory");
  app.add_flag("--smoke-test", cl.smoke,
               "run a short proof of this configuration (temporary checkpoints) and print a verdict");
  app.add_option("--steps", cl.smoke_steps, "steps of the smoke test (default smoke.steps)");
  app.add_option("--resume", cl.resume, "resume from this checkpoint directory (same as --set checkpoint.resume=PATH)");
  app.add_option("--stop-after", cl.opt.stop_after, "stop after this step; the LR schedule still spans train.steps");
}

void add_checkpoint_commands(CLI::App& app, CommandLine& cl) {
  cl.inspect = app.add_subcommand("inspect", "print what a checkpoint directory holds");
  cl.inspect->add_option("dir", cl.inspect_dir, "checkpoint directory (step_XXXXXXXX)")->required();
  cl.exporter = app.add_subcommand("export", "write a checkpoint as a Hugging Face model directory");
  cl.exporter->add_option("--checkpoint", cl.export_opt.checkpoint, "checkpoint step directory (or a root with `latest`)")
      ->required();
  cl.exporter->add_option("--out", cl.export_opt.out, "new directory to write (config.json, model.safetensors)")
      ->required();
  cl.exporter->add_option("--dtype", cl.export_dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  cl.exporter->add_option("--max-shard-size", cl.export_shard,
                          "largest safetensors file before sharding (e.g. 5GB, 200MB)");
}

void add_planning_commands(CLI::App& app, CommandLine& cl) {
  cl.schedule = app.add_subcommand(
      "schedule", "print the pipeline schedule of --config: per-rank timeline, bubble, activation memory");
  cl.schedule->add_option("--world", cl.schedule_world,
                          "processes of the run (default tp x pp x cp x max(dp, 1) of the configuration)");
  cl.schedule->add_option("--trace", cl.schedule_trace,
                           "also write the simulated timeline as Chrome trace events (Perfetto), one row per stage");
  cl.schedule->add_option("--forward-ms", cl.schedule_forward_ms,
                          "milliseconds of the heaviest stage's forward of one micro-batch in --trace (default 1; "
                          "take it from a measured log.trace to lay the two side by side)")
      ->check(CLI::PositiveNumber);
  cl.schedule->fallthrough();  // --config and --set belong to the main command
  trainer::PlanOptions& po = cl.plan_opt;
  cl.plan = app.add_subcommand(
      "plan", "print the memory, communication, bubble and estimated step time of --config on a GPU, launching "
              "nothing; --search ranks every layout of the world size");
  cl.plan->add_option("--world", po.world, "GPUs of the run (default tp x pp x cp x max(dp, 1) of the configuration)");
  cl.plan->add_option("--gpus-per-node", po.gpus_per_node, "GPUs per node (default hardware.gpus_per_node, else 8)");
  cl.plan->add_option("--gpu", po.gpu, "GPU of the hardware table (default hardware.gpu): " + trainer::known_gpu_names());
  cl.plan->add_flag("--search", po.search, "rank every layout of the world size that keeps the global batch");
  cl.plan->add_option("--top", po.top, "layouts the search prints (default 10)");
  cl.plan->fallthrough();
  trainer::CalibrateOptions& co = cl.calibrate_opt;
  cl.calibrate = app.add_subcommand(
      "calibrate", "launched like the run: measure its links (all_reduce, all_gather, reduce_scatter, send/recv "
                   "inside and across nodes) and every rank's matmul rate, and write the hardware section the "
                   "planner reads with hardware.calibration");
  cl.calibrate->add_option("--out", co.out, "file to write (default <run dir>/hardware.yaml)");
  cl.calibrate->add_option("--max-mib", co.max_mib, "largest payload timed, MiB (default 64; 4 with --quick)");
  cl.calibrate->add_option("--min-kib", co.min_kib, "smallest payload timed, KiB (default 4)");
  cl.calibrate->add_flag("--quick", co.quick, "fewer sizes and repetitions: a first look");
  cl.calibrate->fallthrough();
}

void add_model_commands(CLI::App& app, CommandLine& cl) {
  trainer::GenerateOptions& gen = cl.gen;
  CLI::App* g = cl.generate =
      app.add_subcommand("generate", "continue a prompt with the model of a checkpoint (key/value cache)");
  g->add_option("--checkpoint", gen.checkpoint, "checkpoint step directory (or a root with `latest`)")->required();
  g->add_option("--prompt", gen.prompt, "text to continue, encoded with the data's tokenizer")->required();
  g->add_option("--tokens", gen.tokens, "tokens to generate (default 200)");
  g->add_option("--temperature", gen.temperature, "sampling temperature; 0: greedy (default 0.8)");
  g->add_option("--top-k", gen.top_k, "sample among the k most likely tokens (default 0: all)");
  g->add_option("--seed", gen.seed, "seed of the sampling (default 1234)");
  g->add_option("--device", gen.device, "cpu, cuda or auto (default auto)");
  g->add_option("--tokenizer", gen.tokenizer, "tokenizer file or directory (default: the run's, see docs/GENERATE.md \"Generating text\")");
  g->add_flag("--compare", gen.compare, "also run the no-cache reference and say whether the tokens agree");
  trainer::EvalOptions& ev = cl.eval;
  CLI::App* e = cl.evaluate =
      app.add_subcommand("eval", "score a multiple-choice task (HellaSwag's JSON lines) with the model of a checkpoint");
  e->add_option("--checkpoint", ev.checkpoint, "checkpoint step directory (or a root with `latest`)")->required();
  e->add_option("--task", ev.task, "JSON lines: ctx, endings, label (docs/YOUR_DATA.md \"Benchmark evaluation\")")
      ->required();
  e->add_option("--limit", ev.limit, "score the first N examples only (default 0: all)");
  e->add_option("--scores", ev.scores, "write every example's log-likelihoods and picks here (JSON lines)");
  e->add_option("--tokenizer", ev.tokenizer, "tokenizer file or directory (default: the run's)");
  cl.devices = app.add_subcommand(
      "devices", "say what CUDA this machine and build offer (driver, CUDA module, devices) and what device: auto picks");
}

// The subcommands that need no configuration; -1 when none was given.
int run_tool_command(CommandLine& cl) {
  if (*cl.devices) {
    bool ok = true;
    std::fputs(trainer::describe_devices(&ok).c_str(), stdout);
    return ok ? 0 : 1;
  }
  if (*cl.inspect) {
    const std::string report = trainer::describe_checkpoint(cl.inspect_dir);
    std::fputs(report.c_str(), stdout);
    // Scripts check the exit code before they trust a checkpoint.
    return report.find("status: CORRUPT") == std::string::npos ? 0 : 1;
  }
  if (*cl.exporter) {
    cl.export_opt.dtype = cl.export_dtype == "bf16" ? trainer::DType::BF16 : trainer::DType::F32;
    cl.export_opt.max_shard_bytes = trainer::parse_size(cl.export_shard, "--max-shard-size");
    std::fputs(trainer::export_to_hf(cl.export_opt).c_str(), stdout);
    return 0;
  }
  if (*cl.generate) return trainer::run_generate(cl.gen);
  if (*cl.evaluate) return trainer::run_eval(cl.eval);
  return -1;
}

// `trainer plan` and `trainer schedule`, which read --config but launch nothing; -1 when neither.
int run_planning_command(CommandLine& cl) {
  trainer::PlanOptions& po = cl.plan_opt;
  if (*cl.plan) {
    if (po.world < 0 || (cl.plan->count("--world") && po.world == 0))
      throw trainer::ConfigError("--world " + std::to_string(po.world) + ": the number of GPUs must be >= 1");
    if (cl.plan->count("--gpus-per-node") && po.gpus_per_node < 1)
      throw trainer::ConfigError("--gpus-per-node " + std::to_string(po.gpus_per_node) + " must be >= 1");
    const trainer::Config cfg = trainer::load_plan_config(cl.config_path, cl.overrides, po);
    std::fputs(trainer::describe_plan(cfg, po).c_str(), stdout);
    return 0;
  }
  if (*cl.schedule) {
    if (cl.config_path.empty()) throw trainer::ConfigError("trainer schedule needs --config FILE");
    const trainer::Config cfg = trainer::load_config_file(
        cl.config_path, cl.overrides, std::max(cl.schedule_world, 0),
        [](trainer::Config& c) { trainer::adopt_init_from_settings(c); });
    int world = cl.schedule_world;
    if (world <= 0) {
      const auto& p = cfg.parallel;
      world = p.tp * p.pp * p.cp * (p.dp > 0 ? p.dp : 1);
    }
    std::fputs(trainer::describe_schedule(cfg, world, cl.schedule_trace, cl.schedule_forward_ms).c_str(), stdout);
    return 0;
  }
  return -1;
}

// The run's opening lines on rank 0: the configuration, the launch, what
// the HF import adopted, how the store checks its clients.
void print_run_header(const trainer::Config& cfg, const trainer::LaunchInfo& launch,
                      const std::vector<std::string>& adopted) {
  if (launch.rank != 0) return;
  std::printf("config: %s\n%s\n", cfg.source.c_str(), launch.describe().c_str());
  for (const std::string& line : adopted) std::printf("%s\n", line.c_str());
  if (launch.launched())
    std::printf("%s\n", trainer::store_secret_from_env().empty()
                             ? "store: no TRAINER_STORE_SECRET: the job token turns away other jobs, not other users "
                               "who can reach the port (docs/FEATURES.md, \"Who may join a job's rendezvous store\")"
                             : "store: every rank must prove it holds TRAINER_STORE_SECRET");
}

// Training, or its smoke test, under whatever launched this process.
int run_training_command(CommandLine& cl) {
  const trainer::LaunchInfo launch = trainer::detect_launch();
  // model.init_from's config.json fills the model keys the configuration leaves unset, before
  // validation; --print-config then shows what the run would use.
  std::vector<std::string> adopted;
  trainer::Config cfg = trainer::load_config_file(cl.config_path, cl.overrides, launch.world_size,
                                                  [&](trainer::Config& c) { adopted = trainer::adopt_init_from_settings(c); });
  // Once per job, on stderr so that --print-config's YAML stays clean.
  if (launch.rank == 0)
    for (const std::string& w : trainer::config_warnings(cfg)) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (cl.print_config) {
    std::fputs(trainer::config_to_yaml(cfg).c_str(), stdout);
    return 0;
  }
  print_run_header(cfg, launch, adopted);
  cl.opt.launch = launch;
  if (cl.smoke) return trainer::run_smoke_test(cfg, cl.smoke_steps > 0 ? cl.smoke_steps : cfg.smoke.steps, launch);
  if (cl.smoke_steps > 0) throw trainer::ConfigError("--steps applies to --smoke-test only");
  const trainer::TrainSummary summary = trainer::run_training(cfg, cl.opt);
  return summary.preempted ? trainer::kPreemptedExitCode : 0;
}

int run_command(CommandLine& cl) {
  if (const int rc = run_tool_command(cl); rc >= 0) return rc;
  if (!cl.resume.empty()) cl.overrides.push_back("checkpoint.resume=" + cl.resume);
  if (cl.config_path.empty()) throw trainer::ConfigError("no configuration given: pass --config FILE (see configs/)");
  if (const int rc = run_planning_command(cl); rc >= 0) return rc;
  if (*cl.calibrate) return trainer::run_calibrate(cl.config_path, cl.overrides, cl.calibrate_opt);
  return run_training_command(cl);
}

// The exit code of each kind of failure (the header above).
int exit_code_of(std::exception_ptr failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const trainer::ConfigError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const trainer::StepPolicyStop& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return trainer::kStoppedByPolicyExitCode;
  } catch (const trainer::ReplicaMismatch& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return trainer::kReplicaMismatchExitCode;
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

}  // namespace

int main(int argc, char** argv) {
  prepare_process(argv);
  CLI::App app{"trainer: train Transformer and MoE language models from one YAML file"};
  CommandLine cl;
  add_run_options(app, cl);
  add_checkpoint_commands(app, cl);
  add_planning_commands(app, cl);
  add_model_commands(app, cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "error: %s (see trainer --help)\n", e.what());
    return 2;
  }
  try {
    return run_command(cl);
  } catch (...) {
    return exit_code_of(std::current_exception());
  }
}
